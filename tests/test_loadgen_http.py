"""The load generator's lean HTTP client against a real server that frames its answers in each
way HTTP/1.1 allows: a Content-Length, chunks, the end of the connection, and a kept-alive
connection the server closes while it is idle."""

from __future__ import annotations

import asyncio

import pytest

from servelab.loadgen.http import HttpError, PreparedPost

BODY = b'{"prediction": "Soup"}'


async def start_server(framing: str) -> tuple[asyncio.AbstractServer, list[bytes]]:
    """A server on 127.0.0.1 that reads each request whole and answers BODY as `framing` says."""
    received: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(next(line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))[15:])
            received.append(await reader.readexactly(length))
            if framing == "length":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
            elif framing == "chunked":
                chunks = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in (BODY[:5], BODY[5:]))
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")
            elif framing == "until-close":
                writer.write(b"HTTP/1.0 503 Busy\r\n\r\n" + BODY)
            elif framing == "idle-close":  # keep-alive announced, then closed before the next request
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)
            await writer.drain()
            if framing in ("until-close", "idle-close"):
                break
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, received


async def exchange(framing: str, requests: int) -> tuple[list[tuple[int, bytes]], list[bytes], int]:
    server, received = await start_server(framing)
    port = server.sockets[0].getsockname()[1]
    post = PreparedPost(f"http://127.0.0.1:{port}/predict", b"x" * 70_000, {"X-Test": "1"}, timeout_s=5)
    answers = []
    for _ in range(requests):
        answers.append(await post.send())
        await asyncio.sleep(0.05)  # lets the server close an idle connection before the next request
    idle = post.idle_connections
    post.close()
    server.close()
    return answers, received, idle


@pytest.mark.parametrize(
    ("framing", "status", "kept"), [("length", 200, 1), ("chunked", 200, 1), ("until-close", 503, 0)]
)
def test_every_framing_is_read_whole_and_the_connection_kept_when_it_can_be(framing, status, kept):
    answers, received, idle = asyncio.run(exchange(framing, 3))
    assert answers == [(status, BODY)] * 3
    assert received == [b"x" * 70_000] * 3  # the whole body arrived, every time
    assert idle == kept


def test_a_kept_alive_connection_the_server_closed_is_replaced_without_an_error():
    answers, received, _ = asyncio.run(exchange("idle-close", 3))
    assert answers == [(200, BODY)] * 3 and len(received) == 3


def test_nobody_listening_and_a_slow_server_are_told_apart():
    async def refused() -> None:
        server, _ = await start_server("length")
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await PreparedPost(f"http://127.0.0.1:{port}/", b"", {}, timeout_s=2).send()

    with pytest.raises(HttpError) as error:
        asyncio.run(refused())
    assert error.value.kind == "connection"

    async def silent() -> None:
        async def never_answer(reader, writer) -> None:
            await asyncio.sleep(10)

        server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
        try:
            await PreparedPost(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/", b"", {}, timeout_s=0.2).send()
        finally:
            server.close()

    with pytest.raises(HttpError) as error:
        asyncio.run(silent())
    assert error.value.kind == "timeout"
