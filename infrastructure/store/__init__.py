"""The one durable store: the ``Store`` API, its SQL, the SQLite and PostgreSQL backends,
retention, snapshots, usage and the copy of a whole history."""
