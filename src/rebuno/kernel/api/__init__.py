"""The kernel's HTTP edge: the route table, auth, body limits, error envelopes, JSON shapes."""
