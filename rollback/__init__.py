"""revgate rollback package."""
