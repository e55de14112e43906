"""The workers' client's transport (`pronk.engine.http_transport`) against real sockets: answers arrive whole with their
status and headers, and each way a server can fail arrives as the httpx error that names it."""

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
import pytest

from pronk.engine.http_transport import ERRORS, httpx_error, many_requests_client
from pronk.engine.tls import verify_context

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request_head(reader: asyncio.StreamReader) -> bytes:
    return await reader.readuntil(b"\r\n\r\n")


async def _call(handler: Handler, method: str = "GET", **kwargs) -> httpx.Response:
    """One request through the transport to a raw server on 127.0.0.1 that runs `handler`."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = many_requests_client(5.0, verify_context(None), {"authorization": "Bearer t"})
    try:
        async with server:
            return await client.request(method, f"http://127.0.0.1:{port}/path?q=1", **kwargs)
    finally:
        await client.aclose()


def test_an_answer_arrives_whole_with_its_status_and_headers_and_the_request_carries_its_own():
    seen: list[bytes] = []

    async def answer(reader, writer):
        head = await _request_head(reader)
        seen.append(head + await reader.readexactly(len(b'{"step": 1}')))
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nX-Worker: w0\r\n")
        writer.write(b'Content-Length: 11\r\n\r\n{"ok":true}')
        await writer.drain()

    response = asyncio.run(_call(answer, "POST", content=b'{"step": 1}'))
    assert (response.status_code, response.reason_phrase, response.headers["x-worker"]) == (201, "Created", "w0")
    assert response.json() == {"ok": True}
    request = seen[0].decode()
    assert request.startswith("POST /path?q=1 HTTP/1.1\r\n")
    assert "\r\nauthorization: bearer t\r\n" in request.lower() and "\r\ncontent-length: 11\r\n" in request.lower()
    assert request.endswith('\r\n\r\n{"step": 1}')


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def call():
        client = many_requests_client(5.0, verify_context(None))
        try:
            await client.get(f"http://127.0.0.1:{port}/health")
        finally:
            await client.aclose()

    with pytest.raises(httpx.ConnectError):
        asyncio.run(call())


async def _hang_up(reader, writer):
    await _request_head(reader)


async def _half_an_answer(reader, writer):
    await _request_head(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b")
    await writer.drain()


async def _not_http(reader, writer):
    await _request_head(reader)
    writer.write(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    await writer.drain()


@pytest.mark.parametrize("handler", [_hang_up, _half_an_answer, _not_http], ids=["hang-up", "half-answer", "not-http"])
def test_a_server_that_breaks_off_or_speaks_no_http_is_a_protocol_error(handler):
    with pytest.raises(httpx.RemoteProtocolError):
        asyncio.run(_call(handler))


def test_a_server_that_does_not_answer_in_time_is_a_read_timeout():
    async def silent(reader, writer):
        await _request_head(reader)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)

    with pytest.raises(httpx.ReadTimeout):
        asyncio.run(_call(silent, timeout=0.3))


def test_every_aiohttp_error_arrives_as_an_httpx_transport_error_the_most_specific_row_first():
    assert ERRORS[-1][0] is aiohttp.ClientError
    for index, (aiohttp_error, _) in enumerate(ERRORS):
        later = [error for error, _ in ERRORS[index + 1 :]]
        assert not any(issubclass(error, aiohttp_error) for error in later), f"{aiohttp_error} shadows a later row"
    assert isinstance(httpx_error(aiohttp.ServerDisconnectedError()), httpx.RemoteProtocolError)
    assert isinstance(httpx_error(aiohttp.SocketTimeoutError("read")), httpx.ReadTimeout)
    assert isinstance(httpx_error(aiohttp.ConnectionTimeoutError("connect")), httpx.ConnectTimeout)
    assert type(httpx_error(aiohttp.ClientError("other"))) is httpx.NetworkError
