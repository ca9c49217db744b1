"""Agents as files: Claude Code's Markdown with front matter (read byte-exact, as Claude Code
reads it), their docs folders, names, permission profiles and a team's id."""
