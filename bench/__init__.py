"""The benchmark suite: the kernel measured through the public SDK and HTTP API, with the
kernel, the agent and the client as separate processes on loopback. See bench/README.md.

Nothing in `src/rebuno` may import this package.
"""
