"""The ``agentmend`` command: its entry point (``app``) and one module per command group."""
