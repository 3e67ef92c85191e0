"""Live step deltas: the bus seam, the in-process bus and SSE framing (§16)."""
