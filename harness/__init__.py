"""What the test suite, the chaos suite and the benchmark share to drive a kernel from outside:
free loopback ports, bounded polls, real processes (`rebuno dev`, `rebuno server`), a stand-in
agent's webhook and signed calls, private PostgreSQL clusters and a fake LLM provider.

    ports.py         free_port: a loopback port no outgoing connection can take
    polling.py       wait_until (async) and poll_until (blocking): the only sleeps
    asgi.py          the two chores of a hand-written ASGI server: lifespan, whole body
    processes.py     Process, Kernel (`rebuno dev`), Server (`rebuno server`), wait_healthy
    webhooks.py      WebhookReceiver and AgentClient: acting as an agent by hand
    postgres.py      Cluster: a private PostgreSQL cluster to stop, start and restart
    llm_provider.py  FakeProvider: an OpenAI-compatible chat provider on loopback

Not shipped: the wheel holds `src/rebuno` only. Imports rebuno, the standard library and the
drivers; never `tests`, `chaos` or `bench`, which all import it (the import contracts in
pyproject.toml hold both directions).
"""
