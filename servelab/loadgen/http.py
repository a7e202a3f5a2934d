"""A lean HTTP/1.1 client for one prepared request, sent again and again.

A load generator shares the machine with the server it measures: every CPU cycle it spends
parsing headers is a cycle the server does not get. A general client (aiohttp) rebuilds each
request and parses every header into objects; here the request's bytes are built once, and an
answer is read as a status line, the three headers that say where it ends, and its body. Every
request is still sent and its whole answer read, on kept-alive connections, like perf_analyzer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

# A reused connection the server had closed while it was idle fails before any answer arrives;
# the request never reached the server, so it is sent once more on a fresh connection.
_IDLE_CLOSE = (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError)


class HttpError(Exception):
    """The exchange failed: `kind` is "timeout" or "connection"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


async def _within(seconds: float, coroutine):
    """`coroutine`'s result, or asyncio.TimeoutError after `seconds`."""
    async with asyncio.timeout(seconds):  # cheaper than wait_for, which wraps the coroutine in a task
        return await coroutine


class PreparedPost:
    """POST `body` to `url` with `headers`; `send()` returns (status, answer body).

    A request whose body changes from one send to the next (a sequence's flags) is built with
    `build` and sent with `send(request)`, on the same kept-alive connections.
    """

    def __init__(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{url}: the load generator sends plain http:// requests to a host")
        self.host, self.port = parts.hostname, parts.port or 80
        self._request_line = f"POST {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1"
        self._host_line = f"Host: {parts.netloc}"
        self.request = self.build(headers, body)
        self.timeout_s = timeout_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def build(self, headers: dict[str, str], *body: bytes) -> bytes:
        """The bytes of a POST to this URL with `headers` and the concatenation of `body`."""
        head = [
            self._request_line,
            self._host_line,
            f"Content-Length: {sum(map(len, body))}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        return b"".join([("\r\n".join(head) + "\r\n\r\n").encode(), *body])

    async def send(self, request: bytes | None = None) -> tuple[int, bytes]:
        """Send the prepared request, or `request` (from `build`), and read the whole answer."""
        try:
            return await _within(self.timeout_s, self._send(self.request if request is None else request))
        except asyncio.TimeoutError as exc:
            raise HttpError("timeout", f"no complete answer within {self.timeout_s:g} s") from exc
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:  # refused, reset, closed, garbled
            raise HttpError("connection", f"{type(exc).__name__}: {exc}") from exc

    async def _send(self, request: bytes) -> tuple[int, bytes]:
        reused = bool(self._idle)
        connection = self._idle.pop() if reused else await self._connect()
        try:
            return await self._exchange(connection, request)
        except _IDLE_CLOSE:
            if not reused:
                raise
        return await self._exchange(await self._connect(), request)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, limit=1 << 20)

    async def _exchange(
        self, connection: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes
    ) -> tuple[int, bytes]:
        reader, writer = connection
        try:
            writer.write(request)
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length, chunked, keep_alive = framing(head)
            if length is not None:
                body = await reader.readexactly(length)
            elif chunked:
                body = await _read_chunks(reader)
            else:  # the answer ends when the server closes the connection
                body, keep_alive = await reader.read(), False
        except BaseException:
            _close(connection)
            raise
        if keep_alive:
            self._idle.append(connection)
        else:
            _close(connection)
        return status, body

    @property
    def idle_connections(self) -> int:
        """Connections kept open for the next request."""
        return len(self._idle)

    def close(self) -> None:
        while self._idle:
            _close(self._idle.pop())


def framing(head: bytes) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked?, keep-alive?) from the answer's status line and headers."""
    length, chunked, keep_alive = None, False, not head.startswith(b"HTTP/1.0")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            keep_alive = value != b"close"
    return length, chunked, keep_alive


async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
    return b"".join([chunk async for chunk in chunks(reader)])


async def chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The chunks of a chunked body, each as it arrives (a streamed answer reads them one by one)."""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        yield await reader.readexactly(size)
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any, end with an empty line
        pass


def _close(connection: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
    connection[1].close()
