"""Seeing the loop: what the store says (``data``), the page (``page``) and its live server."""
