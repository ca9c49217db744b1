"""The interactive session (``python main.py``), its input and views, and the scripted demo."""
