"""The kernel: the HTTP service that is the only writer of the event log."""
