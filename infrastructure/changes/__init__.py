"""Change and undo: what a fix writes (effectors), what it must pass first (gates), how it is
applied and rolled back byte for byte (the change protocol), and the audit trail."""
