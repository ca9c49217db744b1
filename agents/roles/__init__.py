"""The roles: mediator, improver, supervisor, ask_agent, their definitions and playbooks."""
