"""OpenTelemetry both ways: agent runs from spans (in) and agentmend's own work as spans (out)."""
