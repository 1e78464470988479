"""attnlab.interop."""
