"""The file layer: every write under a root confined and race-free (``confined``, ``links``),
and the atomic writes and locks of single files (``atomic``)."""
