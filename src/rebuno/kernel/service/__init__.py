"""The use cases. `Kernel` holds them; each opens exactly one store transaction."""
