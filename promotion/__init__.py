"""revgate promotion package."""
