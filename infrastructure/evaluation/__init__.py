"""Prove it: eval suites beside each agent and the before/after acceptance test a fix must
pass to be kept."""
