"""The loop that runs the roles: orchestrator, cycle, change pipeline, verification."""
