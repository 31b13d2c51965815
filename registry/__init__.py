"""revgate registry package."""
