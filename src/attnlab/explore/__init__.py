"""attnlab.explore: the interactive attention explorer (a self-contained HTML page)."""
