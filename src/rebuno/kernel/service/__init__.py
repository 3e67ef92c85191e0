"""The use cases, side by side over one floor of transaction fragments, the fast ways beside
the locked scripts, and `Kernel`, which composes the use cases (CONTRIBUTING.md); each use
case opens exactly one store transaction for its own writes."""
