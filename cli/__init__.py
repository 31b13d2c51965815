"""revgate cli package."""
