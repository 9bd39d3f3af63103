"""txlake package."""
