"""Noticing that a client has gone (of /predict, or of a /refine stream: refine_api.py), so that
its request stops taking capacity.

uvicorn does not cancel a handler when its client disconnects: the handler runs to the end and
its answer is thrown away. What can be saved is the work not started yet. `DisconnectWatch`
listens for the ASGI `http.disconnect` message once the body has been read, and the handler
asks it at each stage boundary (before preprocessing, while waiting for a predict slot, before
inference) whether to go on. A request waiting for a slot waits in the inference pool's queue;
when its client leaves, its job is taken out of that queue. A model call already running in a
thread cannot be stopped; the watch still tells, after it, whether its answer had anyone to read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import TypeVar

from starlette.types import Receive

log = logging.getLogger("food11.service")
T = TypeVar("T")

# Where a request can be abandoned, in the order it reaches them.
STAGES = ("before_preprocess", "slot_wait", "before_inference")
# nginx's code for "client closed request": nobody reads it, but logs and metrics do.
CLIENT_CLOSED_REQUEST = 499


class ClientGone(Exception):
    """The client disconnected; the request was abandoned at `stage`."""

    def __init__(self, stage: str) -> None:
        super().__init__(f"the client disconnected; the request was abandoned at {stage}")
        self.stage = stage


class DisconnectWatch:
    """Waits, in a task of its own, for the client of one request to disconnect.

    Start it only after the request body has been read: from then on the only message the
    server can receive for this request is `http.disconnect`. Receiving also tells uvicorn to
    read the socket again, which is how it learns that the peer closed it.
    """

    def __init__(self, receive: Receive, abandon: bool) -> None:
        self.abandon = abandon  # False: only observe, for the experiment that measures the waste
        self.gone = asyncio.Event()
        self._queued: Future | None = None  # the job waiting for a predict slot, if any
        self._task = asyncio.create_task(self._listen(receive))

    async def _listen(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # a server whose receive fails here cannot tell; the request just goes on
            log.debug("Cannot watch this request's connection", exc_info=True)
            return
        self.gone.set()
        if self.abandon and self._queued is not None:
            self._queued.cancel()  # succeeds only while no thread has started it

    def stop(self) -> None:
        self._task.cancel()

    def client_left(self) -> None:
        """The server learnt another way that the client left: the response it was streaming was
        cancelled (Starlette does that when it hears the disconnect first; Ray Serve cancels the
        handler in the replica when its proxy sees the connection close)."""
        self.gone.set()

    def check(self, stage: str) -> None:
        """Raise ClientGone if the client has gone and requests are abandoned. Safe to call from
        an inference thread: it only reads a flag."""
        if self.abandon and self.gone.is_set():
            raise ClientGone(stage)

    async def result_of(self, queued: Future[T]) -> T:
        """The result of `queued`, a job in the inference pool's queue (a predict slot is one of
        the pool's threads). If the client leaves before a thread takes the job, the job leaves
        the queue and ClientGone("slot_wait") is raised; once started, it runs to the end. A
        handler cancelled while it waits (Ray Serve does that) takes its job out of the queue too."""
        self.check("slot_wait")
        self._queued = queued
        try:
            return await asyncio.wrap_future(queued)
        except asyncio.CancelledError:
            handler = asyncio.current_task()
            if queued.cancelled() and self.gone.is_set() and not (handler and handler.cancelling()):
                raise ClientGone("slot_wait") from None
            raise
        finally:
            self._queued = None


@contextlib.asynccontextmanager
async def watching(receive: Receive, abandon: bool) -> AsyncIterator[DisconnectWatch]:
    watch = DisconnectWatch(receive, abandon)
    try:
        yield watch
    finally:
        watch.stop()
