"""revgate flows package."""
