"""revgate shadow package."""
