"""The deterministic machinery the agents stand on: models, specs, store, monitor, changes."""
