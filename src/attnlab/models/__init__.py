"""attnlab.models."""
