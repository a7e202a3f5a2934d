"""Noticing that a /predict client has gone, so that its request stops taking capacity.

uvicorn does not cancel a handler when its client disconnects: the handler runs to the end and
its answer is thrown away. What can be saved is the work not started yet. `DisconnectWatch`
listens for the ASGI `http.disconnect` message once the body has been read, and the handler
asks it at each stage boundary (before preprocessing, while waiting for a predict slot, before
inference) whether to go on. A model call already running in a thread cannot be stopped; the
watch still tells, after it, whether its answer had anyone to read it.
`python -m servelab artifacts` copies this file into each service folder; edit it here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.types import Receive

log = logging.getLogger("food11.service")

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
        self._task = asyncio.create_task(self._listen(receive))

    async def _listen(self, receive: Receive) -> None:
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # a server whose receive fails here cannot tell; the request just goes on
            log.debug("Cannot watch this request's connection", exc_info=True)
            return
        self.gone.set()

    def stop(self) -> None:
        self._task.cancel()

    def check(self, stage: str) -> None:
        """Raise ClientGone if the client has gone and requests are abandoned."""
        if self.abandon and self.gone.is_set():
            raise ClientGone(stage)

    @contextlib.asynccontextmanager
    async def slot(self, slots: asyncio.Semaphore) -> AsyncIterator[None]:
        """Hold one of `slots`, unless the client leaves while the request waits for it."""
        self.check("slot_wait")
        if not self.abandon:
            async with slots:
                yield
            return
        acquiring = asyncio.ensure_future(slots.acquire())
        leaving = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait((acquiring, leaving), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # this handler was cancelled (Ray Serve does that): give back what it holds
            leaving.cancel()
            if acquiring.done() and not acquiring.cancelled():
                slots.release()
            acquiring.cancel()
            raise
        leaving.cancel()
        if not acquiring.done():
            acquiring.cancel()  # a cancelled acquire passes a slot it was just given to the next waiter
            raise ClientGone("slot_wait")
        try:
            self.check("slot_wait")  # both may have happened at once: the client still wins
            yield
        finally:
            slots.release()


@contextlib.asynccontextmanager
async def watching(receive: Receive, abandon: bool) -> AsyncIterator[DisconnectWatch]:
    watch = DisconnectWatch(receive, abandon)
    try:
        yield watch
    finally:
        watch.stop()
