"""Outbound delivery of webhooks to agents. Knows HTTP, not the store or the use cases."""
