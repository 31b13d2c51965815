"""revgate serving package."""
