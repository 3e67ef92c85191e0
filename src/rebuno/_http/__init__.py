"""The lean HTTP/1.1 client of the two hottest HTTP paths: an agent's calls to its kernel and
the kernel's webhook deliveries to agents. Everything else speaks HTTP through httpx.

The package is private and fenced: an import contract in pyproject.toml ("only the hot paths
use the lean HTTP client") names the only modules that may import it, `rebuno.sdk._wire`,
`rebuno.sdk._kernel`, `rebuno.sdk.client` and `rebuno.kernel.webhooks.delivery`, and
another keeps it free of httpx and of the rest of rebuno, so that both the kernel and the SDK
can use it. `codec.py` turns one exchange into bytes and back; `pool.py` owns the connections.

Why a second client rather than an httpx transport: `bench/http_client.py`
(`python -m bench.http_client`) POSTs a small JSON body to uvicorn on loopback, one request
at a time on a kept-alive connection, 9,000 times per client (uvloop; the client process's
CPU only):

    client                                        median   CPU per request
    httpx.AsyncClient                              503 µs   486 µs
    httpx.AsyncClient over a transport on Pool     248 µs   181 µs
    Pool                                            54 µs    30 µs

Most of what the pool saves is in httpx's client itself (URL merging, the cookie jar, the
request and response models), which no transport can skip: behind httpx the pool keeps only
57 to 67 % of the time and the CPU it saves (up to 73 % on a busier machine), and a request
still costs 4.6 times the pool's latency and 6 times its CPU. On asyncio's own loop the
figures are alike.
"""

from rebuno._http.codec import PARSERS, Response, TransportError
from rebuno._http.pool import Pool, Timeout

__all__ = ["PARSERS", "Pool", "Response", "Timeout", "TransportError"]
