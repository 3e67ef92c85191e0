"""Storage: the `Store` seam and its two backends (SQLite, PostgreSQL)."""
