"""httpx's API over aiohttp's connection pool, for clients that send many small concurrent requests: the workers'
client (`pronk.engine.client`) and the benchmark's stock agent loop.

httpx's own pool took 2.2-3.3 ms of CPU a step request on the development machine, this transport 0.3-0.6 ms
(bench/RESULTS.md): CPU that a router, a batch flow or a benchmark's loop takes from the engines it feeds. Callers
keep httpx's requests, responses and errors: every aiohttp error arrives as the httpx error that names the same
failure (a refused connection or certificate is `httpx.ConnectError`, a worker that stops answering a
`httpx.ReadTimeout`), so a dead worker never reads as a slow one. Answers are read whole before they are returned:
these clients exchange small JSON bodies, never streams.
"""

from __future__ import annotations

import ssl

import aiohttp
import httpx

ERRORS: tuple[tuple[type[aiohttp.ClientError], type[httpx.TransportError]], ...] = (
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.TimeoutException),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.RemoteProtocolError),
    (aiohttp.ClientResponseError, httpx.RemoteProtocolError),
    (aiohttp.NonHttpUrlClientError, httpx.UnsupportedProtocol),
    (aiohttp.ClientOSError, httpx.ReadError),
    (aiohttp.ClientError, httpx.NetworkError),
)
"""aiohttp's errors and the httpx errors they arrive as, the most specific first: the first that matches is the one.
A certificate refused is a `ClientConnectorError`, a connection reset mid-answer a `ClientOSError`; the last row
keeps any other aiohttp error an `httpx.TransportError`, which is what callers catch."""

KEEPALIVE_S = 4.0
"""How long an idle connection is kept: below uvicorn's 5 s, after which a worker closes it, so a request is never
sent down a connection the worker is closing."""


def httpx_error(exc: aiohttp.ClientError) -> httpx.TransportError:
    """The httpx error that `exc` arrives as (`ERRORS`)."""
    return next(to_httpx(f"{exc}") for from_aiohttp, to_httpx in ERRORS if isinstance(exc, from_aiohttp))


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, verify: ssl.SSLContext, max_connections: int):
        """`verify`: the context `https://` servers are verified by. The aiohttp session is made at the first
        request, inside the event loop that uses it."""
        self._verify = verify
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                ssl=self._verify, limit=self._max_connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            self._session = aiohttp.ClientSession(connector=connector)
        timeout = request.extensions.get("timeout", {})
        try:
            async with self._session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread() or None,
                allow_redirects=False,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            ) as answer:
                body = await answer.read()
        except aiohttp.ClientError as exc:
            raise httpx_error(exc) from exc
        return httpx.Response(
            status_code=answer.status,
            headers=answer.raw_headers,
            content=body,
            request=request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (answer.reason or "").encode()},
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def many_requests_client(
    timeout_s: float, verify: ssl.SSLContext, headers: dict[str, str] | None = None, max_connections: int = 1024
) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` over `AiohttpTransport`: `timeout_s` for an answer, 5 s to connect."""
    return httpx.AsyncClient(
        timeout=httpx.Timeout(timeout_s, connect=5.0),
        headers=headers,
        transport=AiohttpTransport(verify, max_connections),
    )
