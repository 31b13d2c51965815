"""revgate evaluation package."""
