"""The `rebuno` command line: `dev`, `server` and `version`."""
