"""The scheduler (servelab/service/scheduler.py) in process: real decoding and inference threads,
a real event loop and real DisconnectWatches, with a tiny model that holds each inference until
the test lets it go, so that every state (slots busy, requests waiting for room, a client leaving
while queued) is reached on purpose and then checked. No server: /predict's requests call the
scheduler as its handler does, and POST /refine (refine_api.py) is called as an ASGI app, so
that its streams are checked against the same bounds."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import numpy as np
import pytest
from fastapi import FastAPI

from food11 import InvalidImageError
from servelab import paths
from servelab.service.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, DisconnectWatch, watching
from servelab.service.cores import ThreadPlan, thread_plan
from servelab.service.predict_metrics import PredictMetrics
from servelab.service.refine_api import add_refine_route
from servelab.service.scheduler import InferenceFailed, Scheduler
from tests.helpers import until

WAIT_S = 10  # what a state may take to be reached on a busy machine
PHOTO = base64.b64encode(paths.SAMPLE_IMAGE.read_bytes()).decode()
STEP = "a /refine step"  # what the model records for a step of any stream


class HeldModel:
    """A model whose inferences run until `let_go()`: it records each call (the request's name, the
    threads it was given) and how many ran at once. A /predict request's batch is [[request
    number]]; any other is a /refine step's views, recorded as STEP."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.calls: list[tuple[str, int]] = []
        self.running = self.most_at_once = 0
        self.built_on: str | None = None
        self.go = threading.Event()
        self._lock = threading.Lock()

    def load(self, plan: ThreadPlan):
        self.built_on = threading.current_thread().name

        def run(batch: np.ndarray, threads: int) -> np.ndarray:
            name = self.names[int(batch[0, 0])] if batch.shape == (1, 1) else STEP
            with self._lock:
                self.calls.append((name, threads))
                self.running += 1
                self.most_at_once = max(self.most_at_once, self.running)
            try:
                assert self.go.wait(WAIT_S), "the test never let the inference go"
                if name == "broken":
                    raise RuntimeError("the model failed")
                return np.eye(11)[[0]]
            finally:
                with self._lock:
                    self.running -= 1

        return run

    def let_go(self) -> None:
        self.go.set()

    def ran(self) -> list[str]:
        return [name for name, _ in self.calls]


class Clock:
    """A clock the test moves; decoding an image moves it by `decode_s[image]`."""

    def __init__(self, decode_s: dict[str, float] | None = None) -> None:
        self.now, self.decode_s = 0.0, decode_s or {}

    def __call__(self) -> float:
        return self.now


class Lab:
    """A scheduler around a HeldModel, and an event loop in a thread of its own that runs each
    request as a /predict handler does (`send`): a DisconnectWatch on its (fake) connection, then
    scheduler.predict; and POST /refine on the same scheduler (`refine`). Requests are named;
    `leave(name)` is its client disconnecting."""

    def __init__(self, plan: ThreadPlan, decode_ahead: int, workers: int = 1, abandon: bool = True, clock=None):
        self.names: list[str] = []
        self.decoded: list[str] = []
        self.model = HeldModel(self.names)
        self.abandon = abandon
        self.clock = clock or Clock()
        self.metrics = PredictMetrics()
        self.scheduler = Scheduler(
            self.model.load,
            plan,
            self.decode,
            preprocess_workers=workers,
            decode_ahead=decode_ahead,
            metrics=self.metrics,
            clock=self.clock,
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gone: dict[str, asyncio.Event] = {}
        self.watches: dict[str, DisconnectWatch] = {}
        self.answers: dict[str, Future] = {}
        self.heard_gone: dict[str, threading.Event] = {}  # a /refine request's connection said so
        self.app = FastAPI()
        add_refine_route(self.app, self.scheduler, self.metrics, abandon)

    def decode(self, image: str) -> np.ndarray:
        if image == "not an image":
            raise InvalidImageError("not an image")
        self.clock.now += self.clock.decode_s.get(image, 0.0)
        self.decoded.append(image)
        return np.array([[self.names.index(image)]], dtype=np.float32)

    def send(self, name: str) -> Future:
        self.names.append(name)
        self.gone[name] = gone = asyncio.Event()

        async def receive() -> dict:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def request() -> np.ndarray:
            async with watching(receive, self.abandon) as watch:
                self.watches[name] = watch
                return await self.scheduler.predict(name, watch)

        self.answers[name] = asyncio.run_coroutine_threadsafe(request(), self.loop)
        return self.answers[name]

    def refine(self, name: str, steps: int) -> Future[tuple[int, list[dict]]]:
        """POST /refine of PHOTO over `steps` steps, through the ASGI app, no socket; its answer:
        the status and the stream's lines."""
        self.gone[name] = gone = asyncio.Event()
        self.heard_gone[name] = heard = threading.Event()
        body = json.dumps({"image": PHOTO, "steps": steps}).encode()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/refine", "raw_path": b"/refine", "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
        }  # fmt: skip
        requests = iter([{"type": "http.request", "body": body, "more_body": False}])

        async def receive() -> dict:
            if (message := next(requests, None)) is not None:
                return message
            await gone.wait()
            heard.set()
            return {"type": "http.disconnect"}

        async def request() -> tuple[int, list[dict]]:
            sent: list[dict] = []

            async def send(message: dict) -> None:
                sent.append(message)

            await self.app(scope, receive, send)
            lines = b"".join(message.get("body", b"") for message in sent[1:]).splitlines()
            return sent[0]["status"], [json.loads(line) for line in lines]

        self.answers[name] = asyncio.run_coroutine_threadsafe(request(), self.loop)
        return self.answers[name]

    def leave(self, name: str) -> None:
        self.loop.call_soon_threadsafe(self.gone[name].set)

    def heard(self, name: str) -> None:
        """Return once the watch of /refine request `name` has heard its client leave: its
        connection said so, and the loop has finished the step in which the watch heard it."""
        until(self.heard_gone[name].is_set, WAIT_S, f"{name}'s connection saying it is gone")
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0), self.loop).result(WAIT_S)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0

    def close(self) -> None:
        self.model.let_go()
        self.scheduler.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT_S)
        self.loop.close()


@pytest.fixture
def lab() -> Iterator[Callable[..., Lab]]:
    made: list[Lab] = []

    def make(*args, **kwargs) -> Lab:
        made.append(Lab(*args, **kwargs))
        return made[-1]

    yield make
    for each in made:
        each.close()


def fixed(slots: int, threads: int = 1) -> ThreadPlan:
    return thread_plan(slots, threads, cores=2, environ={}, given_by="the test")


def test_the_slots_run_at_most_one_inference_each_at_once(lab):
    lab = lab(fixed(slots=2), decode_ahead=8, workers=2)
    for name in "abcde":
        lab.send(name)
    until(lambda: lab.scheduler.running == 2, WAIT_S, "both slots busy")
    until(lambda: lab.scheduler.waiting_for_slot == 3, WAIT_S, "the other three decoded, waiting for a slot")
    assert len(lab.model.calls) == 2 and lab.scheduler.ahead == 3
    lab.model.let_go()
    assert all(lab.answers[name].result(WAIT_S).shape == (1, 11) for name in "abcde")
    assert sorted(lab.model.ran()) == list("abcde") and lab.model.most_at_once == 2
    assert (lab.scheduler.running, lab.scheduler.ahead, lab.scheduler.waiting_for_slot) == (0, 0, 0)
    assert lab.model.built_on.startswith("inference")  # built on a slot's thread, never elsewhere


def test_an_inference_gets_the_cores_divided_by_the_inferences_running(lab):
    plan = thread_plan(cores=2, environ={})  # two slots, elastic: 2 threads alone, 1 each together
    assert plan.elastic and (plan.threads_for(1), plan.threads_for(2)) == (2, 1)
    lab = lab(plan, decode_ahead=4)
    lab.send("alone")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the first inference running")
    lab.send("beside it")
    until(lambda: lab.scheduler.running == 2, WAIT_S, "the second inference running beside the first")
    assert lab.model.calls == [("alone", 2), ("beside it", 1)]
    lab.model.let_go()
    lab.answers["beside it"].result(WAIT_S)
    lab.answers["alone"].result(WAIT_S)
    assert lab.scheduler.running == 0
    lab.send("alone again")
    assert lab.answers["alone again"].result(WAIT_S).shape == (1, 11)
    assert lab.model.calls[-1] == ("alone again", 2)  # the count went back down: every core again


def test_decoding_runs_at_most_decode_ahead_requests_ahead_of_a_busy_slot(lab):
    lab = lab(fixed(slots=1), decode_ahead=2, workers=4)
    lab.send("in the slot")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    for name in ("b", "c", "d", "e"):
        lab.send(name)
    until(lambda: lab.scheduler.waiting_for_slot == 2, WAIT_S, "two requests decoded, waiting for the slot")
    until(lambda: lab.scheduler.waiting_for_room == 2, WAIT_S, "two requests waiting, undecoded, for room")
    assert lab.scheduler.ahead == 2 and sorted(lab.decoded) == ["b", "c", "in the slot"]
    lab.model.let_go()
    for name in ("in the slot", "b", "c", "d", "e"):
        lab.answers[name].result(WAIT_S)
    assert sorted(lab.decoded) == ["b", "c", "d", "e", "in the slot"]
    assert lab.scheduler.ahead == 0 and lab.scheduler.waiting_for_room == 0


@pytest.mark.parametrize("abandon", [True, False])
def test_a_request_abandoned_while_queued_never_runs_the_model_and_gives_its_room_back(lab, abandon):
    lab = lab(fixed(slots=1), decode_ahead=1, workers=2, abandon=abandon)
    lab.send("holder")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    lab.send("leaver")
    until(lambda: lab.scheduler.waiting_for_slot == 1, WAIT_S, "the leaver decoded, waiting for the slot")
    lab.send("next")
    until(lambda: lab.scheduler.waiting_for_room == 1, WAIT_S, "the next request waiting for room")
    lab.leave("leaver")
    until(lambda: lab.watches["leaver"].gone.is_set(), WAIT_S, "the leaver's watch hearing it leave")
    if abandon:
        with pytest.raises(ClientGone) as gone:
            lab.answers["leaver"].result(WAIT_S)
        assert gone.value.stage == "slot_wait"
        until(lambda: "next" in lab.decoded, WAIT_S, "the next request decoded in the room the leaver left")
        assert lab.model.ran() == ["holder"] and lab.scheduler.waiting_for_slot == 1  # the next one's
    lab.model.let_go()
    lab.answers["next"].result(WAIT_S)
    lab.answers["holder"].result(WAIT_S)
    if abandon:
        assert lab.model.ran() == ["holder", "next"]
        assert lab.sample("predict_inferences_for_gone_clients_total") == 0
    else:  # observed only: computed for nobody, and counted as such
        assert lab.answers["leaver"].result(WAIT_S).shape == (1, 11)
        assert lab.model.ran() == ["holder", "leaver", "next"]
        assert lab.sample("predict_inferences_for_gone_clients_total") == 1
    assert lab.scheduler.ahead == 0


def test_an_image_that_does_not_decode_gives_its_room_back(lab):
    lab = lab(fixed(slots=1), decode_ahead=1)
    with pytest.raises(InvalidImageError):
        lab.send("not an image").result(WAIT_S)
    assert lab.scheduler.ahead == 0
    lab.model.let_go()
    assert lab.send("photo").result(WAIT_S).shape == (1, 11)


def test_a_failed_inference_is_reported_and_frees_its_slot(lab):
    lab = lab(fixed(slots=1), decode_ahead=1)
    lab.model.let_go()
    with pytest.raises(InferenceFailed, match=r"Inference failed \(RuntimeError\)"):
        lab.send("broken").result(WAIT_S)
    assert lab.scheduler.running == 0
    assert lab.send("photo").result(WAIT_S).shape == (1, 11)


def test_the_slot_wait_is_the_wait_for_room_and_for_the_slot_never_the_decoding(lab):
    # Decoding the first and the second takes half a second each of the test's clock; the third, no time.
    clock = Clock(decode_s={"first": 0.5, "second": 0.5})
    lab = lab(fixed(slots=1), decode_ahead=1, workers=2, clock=clock)
    lab.send("first")  # queued at 0, decoded by 0.5, in the slot at once
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the first request in the slot")
    lab.send("second")  # queued at 0.5, decoded by 1.0, then waits for the slot
    until(lambda: lab.scheduler.waiting_for_slot == 1, WAIT_S, "the second request decoded, waiting")
    lab.send("third")  # queued at 1.0, waits for room until the second takes the slot
    until(lambda: lab.scheduler.waiting_for_room == 1, WAIT_S, "the third request waiting for room")
    clock.now = 4.0
    lab.model.let_go()  # the first ran from 0.5 to 4.0; the second and the third take no time
    for name in ("first", "second", "third"):
        lab.answers[name].result(WAIT_S)
    # Slot waits: the first 0; the second 4.0 - (0.5 + 0.5 decoding) = 3.0; the third, queued at
    # 1.0, waited for room until 4.0: 3.0, its wait for room included.
    assert lab.sample("predict_slot_wait_seconds_count") == 3
    assert lab.sample("predict_slot_wait_seconds_sum") == pytest.approx(6.0)
    assert lab.sample("predict_preprocess_seconds_sum") == pytest.approx(1.0)
    assert lab.sample("predict_inference_seconds_sum") == pytest.approx(3.5)


def test_the_naive_design_holds_the_slot_while_it_prepares_its_batch(lab):
    lab = lab(fixed(slots=1), decode_ahead=2)
    lab.model.let_go()
    lab.names.append("slow download")
    preparing, prepared = threading.Event(), threading.Event()

    def prepare() -> np.ndarray:  # a download inside the slot: the slot is busy until it arrives
        preparing.set()
        assert prepared.wait(WAIT_S)
        return np.array([[0]], dtype=np.float32)

    async def stays() -> dict:  # the naive request's client never leaves
        await asyncio.Event().wait()
        return {}

    async def naive() -> np.ndarray:
        async with watching(stays, True) as watch:
            return await lab.scheduler.predict_holding_the_slot(prepare, watch)

    holding = asyncio.run_coroutine_threadsafe(naive(), lab.loop)
    until(preparing.is_set, WAIT_S, "the naive request preparing its batch in the slot")
    waiting = lab.send("waiting")
    until(lambda: lab.scheduler.waiting_for_slot == 1, WAIT_S, "the other request decoded, waiting for the slot")
    assert lab.model.calls == [] and not waiting.done()  # the slot is held, with the model idle
    prepared.set()
    holding.result(WAIT_S)
    waiting.result(WAIT_S)
    assert lab.model.ran() == ["slow download", "waiting"]


# ---- POST /refine: the same bounds for a stream ------------------------------------------------


def slot_busy_and_room_held(make_lab):
    """A service with one slot, busy ("holder"), and one room ahead of it, held by a decoded request ("queued")."""
    lab = make_lab(fixed(slots=1), decode_ahead=1, workers=2)
    lab.send("holder")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    lab.send("queued")
    until(lambda: lab.scheduler.waiting_for_slot == 1, WAIT_S, "a request decoded, holding the one room")
    return lab


def test_a_refine_stream_s_photo_waits_for_room_ahead_of_the_slots_as_a_request_does(lab):
    lab = slot_busy_and_room_held(lab)
    stream = lab.refine("stream", steps=2)
    until(lambda: lab.scheduler.waiting_for_room == 1, WAIT_S, "the stream's photo waiting, undecoded, for room")
    assert lab.sample("predict_preprocess_seconds_count") == 2 and not stream.done()  # the photo not decoded yet
    lab.model.let_go()
    status, lines = stream.result(WAIT_S)
    assert status == 200 and [line["step"] for line in lines] == [1, 2]
    assert lab.model.ran() == ["holder", "queued", STEP, STEP]
    assert (lab.scheduler.ahead, lab.scheduler.waiting_for_room, lab.scheduler.waiting_for_slot) == (0, 0, 0)


def test_a_refine_stream_s_photo_holds_its_room_until_its_first_step_is_in_a_slot(lab):
    lab = lab(fixed(slots=1), decode_ahead=1, workers=2)
    lab.send("holder")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    stream = lab.refine("stream", steps=2)
    until(lambda: lab.scheduler.ahead == 1, WAIT_S, "the stream's photo decoded, holding the one room")
    lab.send("next")
    # The next request waits for the photo's room, and the stream's first step (submitted once its
    # photo is decoded, on the loop's next turn) for the slot.
    until(
        lambda: lab.scheduler.waiting_for_room == 1 and lab.scheduler.waiting_for_slot == 1,
        WAIT_S,
        "the next request waiting for the photo's room, and the first step for the slot",
    )
    assert "next" not in lab.decoded
    lab.model.let_go()
    assert stream.result(WAIT_S)[0] == 200 and lab.answers["next"].result(WAIT_S).shape == (1, 11)
    # The first step's slot gave the photo's room to the next request.
    assert lab.model.ran()[:2] == ["holder", STEP] and sorted(lab.model.ran()[2:]) == sorted([STEP, "next"])
    assert lab.scheduler.ahead == 0


def test_each_step_of_a_refine_stream_records_its_slot_wait_as_a_request_does(lab):
    clock = Clock()
    lab = lab(fixed(slots=1), decode_ahead=2, workers=2, clock=clock)
    lab.send("holder")  # in the slot from 0
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    stream = lab.refine("stream", steps=3)  # decoded at 0 (in no time on the test's clock), then waits
    until(lambda: lab.sample("refine_running") == 1, WAIT_S, "the stream begun: its photo decoded")
    clock.now = 3.0
    lab.model.let_go()  # the holder ran from 0 to 3.0; the steps take no time
    status, lines = stream.result(WAIT_S)
    assert status == 200 and len(lines) == 3
    # Slot waits: the holder 0; the first step 3.0, from its photo's decoding to the slot; the next two 0.
    assert lab.sample("predict_slot_wait_seconds_count") == 4
    assert lab.sample("predict_slot_wait_seconds_sum") == pytest.approx(3.0)
    assert lab.sample("predict_inference_seconds_count") == 4
    assert lab.sample("predict_preprocess_seconds_count") == 2  # the holder's image, the stream's photo
    assert lab.sample("refine_steps_total") == 3


def test_a_refine_stream_whose_client_leaves_before_its_first_step_gives_its_room_back(lab):
    lab = lab(fixed(slots=1), decode_ahead=1, workers=2)
    lab.send("holder")
    until(lambda: lab.scheduler.running == 1, WAIT_S, "the slot busy")
    stream = lab.refine("leaver", steps=4)
    until(lambda: lab.scheduler.waiting_for_slot == 1, WAIT_S, "the stream's first step waiting for the slot")
    lab.send("next")
    until(lambda: lab.scheduler.waiting_for_room == 1, WAIT_S, "the next request waiting for the photo's room")
    lab.leave("leaver")
    until(lambda: "next" in lab.decoded, WAIT_S, "the next request decoded in the room the stream left")
    lab.model.let_go()
    lab.answers["next"].result(WAIT_S)
    assert stream.result(WAIT_S) == (200, [])  # the stream had begun: it stopped before its first line
    assert lab.model.ran() == ["holder", "next"]
    assert lab.sample("refine_streams_total", outcome="stopped") == 1 and lab.sample("refine_steps_total") == 0
    assert (lab.scheduler.ahead, lab.scheduler.waiting_for_slot) == (0, 0)


def test_a_refine_request_whose_client_leaves_while_its_photo_waits_for_room_is_never_decoded(lab):
    lab = slot_busy_and_room_held(lab)
    stream = lab.refine("leaver", steps=4)
    until(lambda: lab.scheduler.waiting_for_room == 1, WAIT_S, "the stream's photo waiting for room")
    lab.leave("leaver")
    lab.heard("leaver")
    lab.model.let_go()
    status, _ = stream.result(WAIT_S)
    assert status == CLIENT_CLOSED_REQUEST
    assert lab.model.ran() == ["holder", "queued"]
    assert lab.sample("predict_preprocess_seconds_count") == 2  # the photo was never decoded
    assert lab.sample("refine_streams_total", outcome="stopped") == 1
    assert lab.scheduler.ahead == 0
