"""Command-line sub-commands for this family (placeholder until implemented)."""


def register(groups) -> None:
    """Add this family's sub-commands to ``groups`` (see attnlab.commands)."""
