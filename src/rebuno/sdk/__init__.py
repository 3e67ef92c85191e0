"""The agent runtime and the client. Public names are re-exported by `rebuno`; import from there.

Imports only `rebuno.protocol`, httpx and pydantic; never the kernel, never starlette.
"""
