"""The durable change protocol: apply, rollback and recovery under a root, and the leases and
owners of changes that are live but not yet proven."""
