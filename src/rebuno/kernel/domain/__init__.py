"""Pure rules of the kernel: records, transitions, identities. No I/O, no clock."""
