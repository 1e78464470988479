"""attnlab.experiments."""
