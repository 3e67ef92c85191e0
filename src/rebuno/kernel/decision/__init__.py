"""The decision core: every decision the kernel makes about a step, an approval and an
execution's end, and whether a fast way may be taken, as pure functions of typed values.

A decision answers from what its caller read and the time it is given, and returns the answer
with the writes it implies (its events go into the `EventBatch` it is handed); the caller
applies the writes in its transaction. Nothing here does I/O, reads a clock or draws a random
number, so every row of docs/protocol.md's tables is tested here without a store.

Must import only the domain, the policy engine's result types and `rebuno.protocol`: never the
store, the stream, metrics, asyncio or the service layer (an import contract).
"""
