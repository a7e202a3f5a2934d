"""Where and when a request's work runs: the decoding threads, the room to decode ahead of the
predict slots, and the slots themselves (predict_api.py assembles the service around it; POST
/refine runs its steps in the same slots, refine_api.py).

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
  waits together are the queueing delay the lab measures (the slot wait). A slot that frees
  takes the next request from the queue itself, with no round trip through the event loop
  (which, on a busy machine, may not run for a while: measured with the ONNX service on 2 cores
  at 16 clients, slots handed out by the event loop left the cores about 8% idle, and the
  service about 8% slower).
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

import numpy as np

from servelab.service.client_gone import DisconnectWatch
from servelab.service.cores import ThreadPlan
from servelab.service.predict_metrics import PredictMetrics

log = logging.getLogger("food11.service")

EncodedImage = str | bytes  # a base64 string (sent in the request) or file bytes (downloaded)
RunModel = Callable[[np.ndarray, int], np.ndarray]  # run(batch, threads) -> logits


class InferenceFailed(Exception):
    """The model raised; the server log has the traceback."""


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
        # the batch, or when the request leaves without it (failed, abandoned, cancelled).
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
        """Requests decoded, waiting in the slots' queue."""
        return self._waiting_for_slot

    def shutdown(self) -> None:
        self.decoding.shutdown(cancel_futures=True)
        self.slots.shutdown(cancel_futures=True)

    # ---- the stages, each on the thread that runs it ----------------------------------------

    def decode_now(self, image: EncodedImage) -> np.ndarray:
        """Decode and preprocess `image` on this thread, timed."""
        started = self.clock()
        try:
            return self._decode(image)
        finally:
            self.metrics.preprocess_s.observe(self.clock() - started)

    def infer(self, batch: np.ndarray) -> np.ndarray:
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

    def in_slot(self, prepare: Callable[[], np.ndarray], queued_at: float, watch: DisconnectWatch) -> np.ndarray:
        """A request's work in its predict slot (an inference thread): `prepare` gives the batch
        (the naive design downloads and decodes it here, holding the slot), then the model runs."""
        self.metrics.slot_wait_s.observe(self.clock() - queued_at)
        batch = prepare()
        watch.check("before_inference")
        started = self.clock()
        try:
            return self.infer(batch)
        finally:
            self.metrics.inference_s.observe(self.clock() - started)
            if watch.gone.is_set():
                self.metrics.inferences_for_gone_clients.inc()

    def _take_room(self) -> None:
        with self._room:
            self._waiting_for_room += 1
            self._room.wait_for(lambda: self._ahead < self.decode_ahead)
            self._waiting_for_room -= 1
            self._ahead += 1

    def _give_room_back(self, left_the_queue: bool = False) -> None:
        with self._room:
            assert self._ahead > 0, "room given back that was never taken"
            self._ahead -= 1
            self._waiting_for_slot -= left_the_queue
            self._room.notify()

    def _decode_with_room(self, image: EncodedImage, watch: DisconnectWatch) -> tuple[np.ndarray, float]:
        """In a decoding thread: wait for room ahead of the slots, then decode. Returns the batch,
        and the seconds it took to decode (which are not part of the slot wait)."""
        self._take_room()
        started = self.clock()
        try:
            watch.check("before_preprocess")
            return self.decode_now(image), self.clock() - started
        except BaseException:
            self._give_room_back()
            raise

    # ---- a request, on the event loop ---------------------------------------------------------

    async def decode(self, image: EncodedImage, watch: DisconnectWatch) -> tuple[np.ndarray, float]:
        """The batch of `image`, decoded once there is room ahead of the slots, and the seconds the
        decoding took. The caller owns its room until a slot takes the batch."""
        decoding = self.decoding.submit(self._decode_with_room, image, watch)
        try:
            return await asyncio.wrap_future(decoding)
        except asyncio.CancelledError:
            # The handler itself was cancelled (Ray Serve does that): a batch decoded now would
            # never reach a slot, so its room is given back when the decoding ends.
            decoding.add_done_callback(self._room_given_back_unless_failed)
            raise

    def _room_given_back_unless_failed(self, decoding: Future) -> None:
        if not decoding.cancelled() and decoding.exception() is None:
            self._give_room_back()

    def _room_given_back_if_left_queued(self, job: Future) -> None:
        if job.cancelled():  # its client left while it waited for a slot: no slot takes its batch
            self._give_room_back(left_the_queue=True)

    async def predict(self, image: EncodedImage, watch: DisconnectWatch) -> np.ndarray:
        """The logits of `image`: decoded ahead of the slots, then run in the first free slot."""
        queued_at = self.clock()  # a download is not a wait for the slot; what follows is
        batch, decode_s = await self.decode(image, watch)

        def prepare() -> np.ndarray:
            self._give_room_back(left_the_queue=True)  # the slot has taken the batch
            return batch

        with self._room:
            self._waiting_for_slot += 1
        # The slot wait is every wait from here on, before and after decoding.
        job = self.slots.submit(self.in_slot, prepare, queued_at + decode_s, watch)
        job.add_done_callback(self._room_given_back_if_left_queued)
        return await watch.result_of(job)

    async def predict_holding_the_slot(self, prepare: Callable[[], np.ndarray], watch: DisconnectWatch) -> np.ndarray:
        """The naive design: the logits of the batch `prepare` gives, which runs in the slot,
        holding it (and with it the model) while it downloads and decodes."""
        job = self.slots.submit(self.in_slot, prepare, self.clock(), watch)
        return await watch.result_of(job)
