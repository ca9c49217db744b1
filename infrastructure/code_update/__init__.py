"""Code-level updates: plans of file operations or diffs, applied as one change group and
kept only if every changed file compiles and the configured tests pass."""
