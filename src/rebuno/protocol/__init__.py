"""The wire contract shared by the kernel and the SDK. Standard library only."""
