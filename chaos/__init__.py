"""The fault-injection suite (`make chaos`): bounded scenarios on loopback with real processes,
each reporting its figures. `chaos.result` holds the shape every scenario answers with,
`chaos.registry` names the scenarios, `chaos.cli` runs them and writes the report.
"""
