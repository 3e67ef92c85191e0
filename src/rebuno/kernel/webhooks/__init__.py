"""Webhooks out to agents: `delivery.py` signs and POSTs one (§6) and reports its outcome.
Which URLs an agent may register is the domain's rule (`domain/webhook.py`). Knows HTTP, not
the store, the use cases or the API.
"""
