"""attnlab.data."""
