"""Releases: a team's definitions as immutable versions, followed by workers, canaried."""
