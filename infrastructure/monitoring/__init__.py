"""Record and detect: every execution recorded cheaply, per-agent baselines, and the
CUSUM and rule detectors that turn a degrading agent into an ``IssueReport``."""
