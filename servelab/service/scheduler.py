"""Where and when a request's work runs: the decoding threads, the room to decode ahead of the
predict slots, and the slots themselves. Every request's work goes through its operations, so
that the bounds below hold for all of them: a /predict request's (`predict`, assembled into the
service by predict_api.py) and a /refine stream's (refine_api.py: its photo is decoded once with
`decode`, as a /predict request's image is, and each of its steps waits for a slot with
`run_in_slot`).

- Base64 and image decoding plus preprocessing run in a thread pool (PREPROCESS_WORKERS), off
  the event loop, so a slow decode never blocks other requests from being accepted, and a decode
  can overlap with an inference in progress.
- Decoding runs at most DECODE_AHEAD requests ahead of the predict slots (default: two per slot,
  and at least one per decoding thread): a request is decoded only when there is room among those
  being decoded or decoded and waiting for a slot; the rest wait undecoded. Memory stays bounded
  however many clients send, and on a CPU the decoding thread does not run far ahead, taking
  cores from the inferences and leaving tensors to go cold before their slot (measured with the
  ONNX service on 2 cores at 16 clients: 3-7% more throughput than with no bound).
- Only the model call is limited: it runs in a pool of PREDICT_CONCURRENCY threads, the predict
  slots. Requests beyond that wait, for room to be decoded and then in the pool's queue: the two
  waits together are the queueing delay the lab measures (the slot wait; a /refine stream's steps
  after its first wait only in the queue). A slot that frees takes the next request from the
  queue itself, with no round trip through the event loop (which, on a busy machine, may not run
  for a while: measured with the ONNX service on 2 cores at 16 clients, slots handed out by the
  event loop left the cores about 8% idle, and the service about 8% slower).
- Threads are a resource (cores.py): an inference gets the threads the plan gives it for the
  inferences running when it starts (elastic: the cores divided by them), so the busy threads
  never outnumber the cores. The model is built on an inference thread, so that no other thread
  ever starts a team of threads for it: a second, idle team slows every inference of the first.
- A request whose client has gone (client_gone.py) is abandoned before it is decoded (once there
  is room), while it waits for a slot (its job leaves the queue and gives its room back), and
  before inference, unless its watch only observes (ABANDON_ON_DISCONNECT=off).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Generic, TypeVar

import numpy as np

from servelab.service.client_gone import DisconnectWatch
from servelab.service.cores import ThreadPlan
from servelab.service.predict_metrics import PredictMetrics

log = logging.getLogger("food11.service")

EncodedImage = str | bytes  # a base64 string (sent in the request) or file bytes (downloaded)
RunModel = Callable[[np.ndarray, int], np.ndarray]  # run(batch, threads) -> logits
T = TypeVar("T")


class InferenceFailed(Exception):
    """The model raised; the server log has the traceback."""


class Decoded(Generic[T]):
    """What a request decoded ahead of the slots (a /predict request's batch, a /refine stream's
    views). It holds its room until a slot takes its first model call, or until its request
    needs no slot any more (`Scheduler.give_room_back`)."""

    def __init__(self, value: T, waiting_since: float) -> None:
        self.value = value
        self.waiting_since = waiting_since  # when its slot wait began: its decoding is no part of it
        self.holds_room = True  # set to False once, under the scheduler's room lock


class Scheduler:
    """The decoding pool, the room to decode ahead of the slots, and the predict slots.

    `load(plan)` builds the model on an inference thread and returns run(batch, threads);
    `decode(image)` turns an image into a batch (raising food11.InvalidImageError for one that is
    not an image). `metrics` gets each stage's time, measured with `clock`."""

    def __init__(
        self,
        load: Callable[[ThreadPlan], RunModel],
        plan: ThreadPlan,
        decode: Callable[[EncodedImage], np.ndarray],
        *,
        preprocess_workers: int,
        decode_ahead: int,
        metrics: PredictMetrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.plan, self.decode_ahead, self.metrics, self.clock = plan, decode_ahead, metrics, clock
        self._decode = decode
        self.decoding = ThreadPoolExecutor(preprocess_workers, thread_name_prefix="preprocess")
        self.slots = ThreadPoolExecutor(plan.slots, thread_name_prefix="inference")  # the predict slots
        self._run_model = self.slots.submit(load, plan).result()
        self._running = 0  # inferences running now, changed by the inference threads
        self._running_lock = threading.Lock()
        # Room to decode: taken by a decoding thread before it decodes, given back when a slot takes
        # the decoded work, or when the request leaves without it (failed, abandoned, cancelled).
        self._room = threading.Condition()
        self._ahead = 0  # requests holding room: being decoded, or decoded and waiting for a slot
        self._waiting_for_room = 0
        self._waiting_for_slot = 0

    @property
    def running(self) -> int:
        """Inferences running now."""
        return self._running

    @property
    def ahead(self) -> int:
        """Requests being decoded, or decoded and waiting for a slot (at most decode_ahead)."""
        return self._ahead

    @property
    def waiting_for_room(self) -> int:
        """Requests waiting, undecoded, for room to be decoded."""
        return self._waiting_for_room

    @property
    def waiting_for_slot(self) -> int:
        """Model calls waiting in the slots' queue (a /predict request's, a /refine step's)."""
        return self._waiting_for_slot

    def shutdown(self) -> None:
        self.decoding.shutdown(cancel_futures=True)
        self.slots.shutdown(cancel_futures=True)

    # ---- the stages, each on the thread that runs it ----------------------------------------

    def decode_now(self, image: EncodedImage) -> np.ndarray:
        """Decode and preprocess `image` on this thread, timed."""
        return self._timed_decoding(partial(self._decode, image))

    def _timed_decoding(self, decoding: Callable[[], T]) -> T:
        started = self.clock()
        try:
            return decoding()
        finally:
            self.metrics.preprocess_s.observe(self.clock() - started)

    def _infer(self, batch: np.ndarray) -> np.ndarray:
        """Run the model on an inference thread (a predict slot), with the threads the plan gives
        an inference that starts while the others run."""
        with self._running_lock:
            self._running += 1
            threads = self.plan.threads_for(self._running)
        try:
            return self._run_model(batch, threads)
        except Exception as exc:
            log.exception("Inference failed on a batch of shape %s", batch.shape)
            failed = f"Inference failed ({type(exc).__name__}); the server log has the traceback."
            raise InferenceFailed(failed) from exc
        finally:
            with self._running_lock:
                self._running -= 1

    def _in_slot(
        self,
        prepare: Callable[[], np.ndarray],
        waiting_since: float,
        watch: DisconnectWatch,
        ahead: Decoded | None,
        answered: Callable[[], None] | None,
    ) -> np.ndarray:
        """A model call's work in its predict slot (an inference thread): `prepare` gives the batch
        (the naive design downloads and decodes it here, holding the slot), then the model runs."""
        self._left_the_queue(ahead)
        self.metrics.slot_wait_s.observe(self.clock() - waiting_since)
        batch = prepare()
        watch.check("before_inference")
        started = self.clock()
        try:
            logits = self._infer(batch)
        finally:
            self.metrics.inference_s.observe(self.clock() - started)
            if watch.gone.is_set():
                self.metrics.inferences_for_gone_clients.inc()
        if answered is not None:
            answered()
        return logits

    def _take_room(self) -> None:
        with self._room:
            self._waiting_for_room += 1
            self._room.wait_for(lambda: self._ahead < self.decode_ahead)
            self._waiting_for_room -= 1
            self._ahead += 1

    def _free_room(self) -> None:
        with self._room:
            assert self._ahead > 0, "room given back that was never taken"
            self._ahead -= 1
            self._room.notify()

    def _decode_with_room(self, decoding: Callable[[], T], queued_at: float, watch: DisconnectWatch) -> Decoded[T]:
        """In a decoding thread: wait for room ahead of the slots, then decode. The slot wait began
        at `queued_at`, less the time the decoding takes."""
        self._take_room()
        started = self.clock()
        try:
            watch.check("before_preprocess")
            value = self._timed_decoding(decoding)
        except BaseException:
            self._free_room()
            raise
        return Decoded(value, queued_at + self.clock() - started)

    # ---- a request, on the event loop ---------------------------------------------------------

    async def decode(self, decoding: Callable[[], T], watch: DisconnectWatch) -> Decoded[T]:
        """What `decoding` makes of a request's image, run in a decoding thread once there is room
        ahead of the slots (timed as preprocessing). It holds its room until a slot takes it
        (`run_in_slot(..., ahead=it)`) or it is given back (`give_room_back`)."""
        queued_at = self.clock()  # a download is not a wait for the slot; what follows is
        job = self.decoding.submit(self._decode_with_room, decoding, queued_at, watch)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            # The handler itself was cancelled (Ray Serve does that): what is decoded now would
            # never reach a slot, so its room is given back when the decoding ends.
            job.add_done_callback(self._room_given_back_unless_failed)
            raise

    def give_room_back(self, decoded: Decoded) -> None:
        """The room `decoded` holds goes back, once: a slot has taken it, or its request needs no
        slot any more. Safe to call from any thread, and again."""
        with self._room:
            if not decoded.holds_room:
                return
            decoded.holds_room = False
            self._free_room()

    def _room_given_back_unless_failed(self, job: Future[Decoded]) -> None:
        if not job.cancelled() and job.exception() is None:
            self.give_room_back(job.result())

    def _left_the_queue(self, ahead: Decoded | None) -> None:
        """A model call has left the slots' queue (a slot took it, or its client left): the room of
        what it decoded ahead goes back."""
        with self._room:
            self._waiting_for_slot -= 1
        if ahead is not None:
            self.give_room_back(ahead)

    def _left_the_queue_if_cancelled(self, ahead: Decoded | None, job: Future) -> None:
        if job.cancelled():  # its client left while it waited for a slot: no slot takes it
            self._left_the_queue(ahead)

    async def run_in_slot(
        self,
        prepare: Callable[[], np.ndarray],
        watch: DisconnectWatch,
        *,
        ahead: Decoded | None = None,
        answered: Callable[[], None] | None = None,
    ) -> np.ndarray:
        """The logits of the batch `prepare` gives, run in the first free slot: a job in the slots'
        queue, which leaves it if its client does (DisconnectWatch.result_of). `ahead`: what the
        request decoded ahead of the slots, whose room the slot takes and whose slot wait began
        when its decoding ended; without it, the wait begins now. `answered` runs in the slot once
        the model has answered (a /refine step counts itself there, cancelled or not)."""
        waiting_since = self.clock() if ahead is None else ahead.waiting_since
        with self._room:
            self._waiting_for_slot += 1
        job = self.slots.submit(self._in_slot, prepare, waiting_since, watch, ahead, answered)
        job.add_done_callback(partial(self._left_the_queue_if_cancelled, ahead))
        return await watch.result_of(job)

    async def predict(self, image: EncodedImage, watch: DisconnectWatch) -> np.ndarray:
        """The logits of `image`: decoded ahead of the slots, then run in the first free slot."""
        batch = await self.decode(partial(self._decode, image), watch)
        return await self.run_in_slot(lambda: batch.value, watch, ahead=batch)

    async def predict_holding_the_slot(self, prepare: Callable[[], np.ndarray], watch: DisconnectWatch) -> np.ndarray:
        """The naive design: the logits of the batch `prepare` gives, which runs in the slot,
        holding it (and with it the model) while it downloads and decodes."""
        return await self.run_in_slot(prepare, watch)
