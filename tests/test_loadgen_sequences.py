"""The load generator's sequence mode against a synthetic stateful server, then against the real Triton.

The synthetic server speaks KServe v2 with binary tensors over real HTTP on 127.0.0.1, in a thread
of the test process. It keeps sequences as Triton's sequence batcher does (START opens one, END
closes it, a frame of a sequence it does not know is refused with Triton's own message), answers
each frame after a delay the test sets, fails the frames the test names with the message it gives,
and records every frame's sequence ID and flags.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
from aiohttp import web

from servelab import loadgen, paths
from servelab.loadgen import (
    SEQUENCE_ERRORS,
    SequenceLoad,
    TritonHttpSequenceTarget,
    run_sequences,
    sequence_error_kind,
)
from servelab.results import SequenceRunResult, load_results, save_results
from servelab.triton.models import ModelError, ModelRepository, ModelRequest, RequestTensor
from tests.helpers import kept_schedule

FRAME = ModelRequest(
    (RequestTensor("FRAME", "BYTES", np.array([[b"a base64 photo: the server does not look"]], dtype=object)),),
    ("SEQUENCE_LABEL",),
)
NOT_STARTED = "inference request for sequence {} to model 'toy' must specify the START flag on the first request"


@dataclass
class Frame:
    sequence_id: int
    start: bool
    end: bool
    arrived: float  # time.perf_counter() on the server
    index: int  # its place in its sequence, as the server counted


class SequenceServer:
    """The synthetic stateful server; `configure` before each run, then read what it recorded."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.configure()

    def configure(self, sleep_ms: float = 0.0, failures: dict[tuple[int, int], str] | None = None) -> SequenceServer:
        """Frames take `sleep_ms`; `failures`: (n-th sequence started, frame index) -> error message.
        Returns the server, so that a run measured again (`kept_schedule`) starts afresh."""
        self.sleep_s, self.failures = sleep_ms / 1000, failures or {}
        self.frames: list[Frame] = []
        self.live: dict[int, int] = {}  # sequence ID -> frames seen
        self.ordinal: dict[int, int] = {}  # sequence ID -> n-th sequence started
        self.in_flight: set[int] = set()
        self.most_live = 0
        self.overlapping = 0  # frames that arrived while a frame of their sequence was in flight
        self.bad_bodies = 0  # bodies whose tensor bytes do not match the header
        return self

    async def infer(self, request: web.Request) -> web.Response:
        body = await request.read()
        header_length = int(request.headers["Inference-Header-Content-Length"])
        header = json.loads(body[:header_length])
        declared = sum(item["parameters"]["binary_data_size"] for item in header["inputs"])
        self.bad_bodies += len(body) - header_length != declared
        parameters = header.get("parameters", {})
        sequence_id = parameters["sequence_id"]
        start, end = parameters.get("sequence_start", False), parameters.get("sequence_end", False)
        if start:
            self.live[sequence_id] = 0
            self.ordinal[sequence_id] = len(self.ordinal)
            self.most_live = max(self.most_live, len(self.live))
        index = self.live.get(sequence_id, -1)
        self.frames.append(Frame(sequence_id, start, end, time.perf_counter(), index))
        if index < 0:
            return web.json_response({"error": NOT_STARTED.format(sequence_id)}, status=400)
        self.overlapping += sequence_id in self.in_flight
        self.in_flight.add(sequence_id)
        await asyncio.sleep(self.sleep_s)
        self.in_flight.discard(sequence_id)
        self.live[sequence_id] += 1
        failure = self.failures.get((self.ordinal[sequence_id], index))
        if failure or end:
            del self.live[sequence_id]
        if failure:
            return web.json_response({"error": failure}, status=400)
        return web.json_response({"model_name": "toy", "outputs": []})

    def by_sequence(self) -> dict[int, list[Frame]]:
        grouped = defaultdict(list)
        for frame in self.frames:
            grouped[frame.sequence_id].append(frame)
        return dict(grouped)

    def start(self) -> str:
        self.thread.start()
        return asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()

    async def _start(self) -> str:
        app = web.Application()
        app.add_routes([web.post("/v2/models/toy/infer", self.infer)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"127.0.0.1:{self.runner.addresses[0][1]}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture(scope="module")
def server():
    synthetic = SequenceServer()
    synthetic.address = synthetic.start()
    yield synthetic
    synthetic.stop()


def run(server: SequenceServer, concurrency: int, length: int, **options) -> SequenceRunResult:
    target = TritonHttpSequenceTarget(server.address, "toy", FRAME)
    return asyncio.run(run_sequences(target, SequenceLoad(concurrency, length, **options), progress=False))


# ---- what every sequence carries -------------------------------------------------------------


@pytest.mark.integration
def test_each_sequence_has_its_own_id_starts_on_its_first_frame_and_ends_on_its_last(server):
    server.configure(sleep_ms=5)
    result = run(server, 4, 5, sequences=10)
    assert (result.mode, result.concurrency, result.sequence_length) == ("sequences", 4, 5)
    assert result.errors == {} and result.sequences_failed == {}
    assert result.sequences == result.sequences_completed == 10
    assert result.requests == len(result.latencies_ms) == 50 and len(result.sequence_latencies_ms) == 10
    sequences = server.by_sequence()
    assert len(sequences) == 10  # ten distinct IDs
    for frames in sequences.values():
        assert [(frame.start, frame.end) for frame in frames] == [(True, False)] + [(False, False)] * 3 + [
            (False, True)
        ]
    assert server.bad_bodies == 0 and server.live == {}  # the tensors arrived whole; every sequence ended


@pytest.mark.integration
def test_ids_are_never_reused_by_a_later_run(server):
    ids = []
    for _ in range(2):
        server.configure()
        run(server, 2, 2)
        ids.append(set(server.by_sequence()))
    assert len(ids[0]) == len(ids[1]) == 2 and not ids[0] & ids[1]


@pytest.mark.integration
def test_concurrency_is_the_number_of_live_sequences(server):
    result = kept_schedule(lambda: run(server.configure(sleep_ms=20), 6, 4, sequences=12))
    assert result.sequences_completed == 12
    assert server.most_live == 6  # six at once, never more: a slot starts its next sequence after the last ends
    assert server.overlapping == 0  # one frame of a sequence in flight at a time
    # Six sequences' frames in flight at once: about six frames per frame latency.
    assert result.throughput_rps == pytest.approx(6 / (result.latency.mean_ms / 1000), rel=0.3)


@pytest.mark.integration
def test_a_sequence_lasts_its_length_times_the_frame_latency(server):
    result = kept_schedule(lambda: run(server.configure(sleep_ms=20), 2, 6, sequences=4))
    assert 20 <= result.latency.p50_ms <= 20 + 40  # the server's 20 ms, and a busy machine's round trip
    assert result.sequence_latency.p50_ms == pytest.approx(6 * result.latency.mean_ms, rel=0.2)


@pytest.mark.integration
def test_a_duration_bounds_the_sequences_started(server):
    result = kept_schedule(lambda: run(server.configure(sleep_ms=10), 2, 5, duration_s=0.5))
    # About 2 slots x 0.5 s / 50 ms per sequence; those under way at the deadline run to their end.
    longest_s = result.sequence_latency.max_ms / 1000
    assert 0.5 <= result.wall_s <= 0.5 + longest_s + 0.1
    started = 2 * 0.5 / (result.sequence_latency.mean_ms / 1000)  # what two slots start in 0.5 s
    assert result.sequences == result.sequences_completed == pytest.approx(started, abs=2 + 0.2 * started)


# ---- a camera's frame rate -------------------------------------------------------------------


@pytest.mark.integration
def test_frames_come_due_at_the_frame_interval(server):
    result = kept_schedule(lambda: run(server.configure(sleep_ms=5), 1, 6, frame_interval_s=0.04))
    assert result.frames_skipped == 0 and result.requests == 6
    (frames,) = server.by_sequence().values()
    gaps = np.diff([frame.arrived for frame in frames])
    assert gaps == pytest.approx([0.04] * 5, abs=0.012)
    assert result.sequence_latency.max_ms == pytest.approx(5 * 40 + 5, abs=20)


@pytest.mark.integration
def test_frames_due_while_the_previous_is_in_flight_are_skipped_never_queued(server):
    """Frames due every 100 ms, answered after 150: each sent frame covers the next one's due time,
    which is skipped. Of 10 frames, 0, 2, 4, 6 and 8 go out on time; 9 is due while 8 is in
    flight, but it carries END, so it goes out as soon as 8 is answered. An answer is 50 ms clear of
    each due time on either side: a busy machine's round trip does not move a frame across one."""
    result = kept_schedule(lambda: run(server.configure(sleep_ms=150), 2, 10, frame_interval_s=0.1))
    assert result.errors == {} and result.sequences_completed == 2
    assert result.frames_skipped == 2 * 4 and result.requests == 2 * 6
    assert server.overlapping == 0
    for frames in server.by_sequence().values():
        assert [frame.index for frame in frames] == list(range(6))  # the server saw six frames, in order
        assert frames[-1].end and not any(frame.end for frame in frames[:-1])
    assert "8 skipped" in loadgen.describe_result(result)


# ---- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        ("evicted: sequence 12 was evicted from the state cache (capacity 4)", "evicted"),
        ("expired: sequence 12 lived longer than its 5 s total timeout", "expired"),
        ("timed out: sequence 12 was idle for 2 s", "timed_out"),
        ("cancelled: sequence 12 was cancelled by its client", "cancelled"),
        ("ended: sequence 12 already ended", "ended"),
        (NOT_STARTED.format(12), "not_started"),
        ("Failed to decode the image", "other"),
        ("the sequence was appended", "other"),  # a word that merely contains "ended" is no reason
    ],
)
def test_triton_errors_are_classified_by_the_reason_they_name(message, kind):
    assert sequence_error_kind(message) == kind and kind in SEQUENCE_ERRORS


@pytest.mark.integration
def test_an_error_breaks_its_sequence_only_and_is_counted_by_reason(server):
    failures = {
        (0, 2): "evicted: the state cache was full",
        (1, 0): "timed out: the sequence was idle too long",
        (2, 3): NOT_STARTED.format("x"),
    }
    server.configure(sleep_ms=10, failures=failures)
    result = run(server, 4, 5)
    assert result.sequences_failed == {"evicted": 1, "timed_out": 1, "not_started": 1}
    assert result.errors == result.sequences_failed  # one failed frame per failed sequence
    assert result.sequences == 4 and result.sequences_completed == 1
    assert len(result.sequence_latencies_ms) == 1  # only completed sequences have a sequence latency
    seen = sorted(len(frames) for frames in server.by_sequence().values())
    assert seen == [1, 3, 4, 5]  # no frame after the one that failed; the healthy sequence went on
    assert result.requests == 13 and len(result.latencies_ms) == 10


@pytest.mark.integration
def test_a_frame_of_a_sequence_the_server_does_not_know_is_not_started(server):
    server.configure()
    target = TritonHttpSequenceTarget(server.address, "toy", FRAME)

    async def middle_frame() -> None:
        try:
            await target.send_frame(424242, start=False, end=False)
        finally:
            await target.close()

    with pytest.raises(loadgen.RequestError) as error:
        asyncio.run(middle_frame())
    assert error.value.kind == "not_started" and "HTTP 400" in error.value.detail


# ---- the record, the synchronous API, refusals ----------------------------------------------


@pytest.mark.integration
def test_the_result_is_saved_and_loaded_back_as_a_sequence_result(server, tmp_path):
    server.configure(sleep_ms=2, failures={(1, 1): "expired: too old"})
    result = run(server, 2, 3)
    [loaded], _ = load_results(save_results([result], tmp_path / "runs.json"))
    assert isinstance(loaded, SequenceRunResult) and loaded == result
    assert loaded.sequences_failed == {"expired": 1} and loaded.sequence_latency.p50_ms > 0
    assert "2 sequences x 3 frames" in loaded.label
    summary = loadgen.describe_result(loaded)
    assert "2 sequences of 3 frames at once" in summary and "failed: 1 expired" in summary


def _toy_stateful_repository(folder) -> ModelRepository:
    model = folder / "toy"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "toy"\nbackend: "python"\nmax_batch_size: 4\n'
        'input [{ name: "FRAME", data_type: TYPE_FP32, dims: [ 4 ] }]\n'
        'output [{ name: "SEQUENCE_LABEL", data_type: TYPE_STRING, dims: [ 1 ] }]\n'
        "sequence_batching { max_sequence_idle_microseconds: 1000000 }\n"
    )
    return ModelRepository(folder, entries={})


@pytest.mark.integration
def test_the_synchronous_api_runs_sequences_of_a_stateful_model_from_the_registry(server, tmp_path):
    models = _toy_stateful_repository(tmp_path)
    server.configure(sleep_ms=2)
    endpoint = loadgen.Endpoint("triton-http", server.address, "toy", models=models)
    result = loadgen.sequence_loop(endpoint, SequenceLoad(2, 3), progress=False)
    assert result.sequences_completed == 2 and result.errors == {}


@pytest.mark.integration
def test_cancelling_a_run_returns_what_was_measured(server):
    server.configure(sleep_ms=10)

    async def cancel_after(seconds: float) -> SequenceRunResult:
        target = TritonHttpSequenceTarget(server.address, "toy", FRAME)
        task = asyncio.create_task(run_sequences(target, SequenceLoad(2, 10, sequences=10_000), progress=False))
        await asyncio.sleep(seconds)
        task.cancel()
        return await task

    result = asyncio.run(cancel_after(0.4))
    assert result.requests > 20 and len(result.latencies_ms) == result.requests
    assert result.notes == [f"stopped early by Ctrl-C after {result.requests} frames"]
    assert result.sequences_completed < result.sequences  # the two under way were neither completed nor failed


def test_impossible_runs_are_refused():
    with pytest.raises(SystemExit):  # the command line sends sequences to Triton only
        loadgen.main(["--target", "fastapi", "--address", "http://127.0.0.1:1", "--sequences", "2"])
    with pytest.raises(ModelError, match="not stateful"):
        loadgen.make_sequence_target(loadgen.Endpoint("triton-http", "127.0.0.1:1", "food_classifier"))
    with pytest.raises(ValueError, match="sequences go to Triton"):
        loadgen.make_sequence_target(loadgen.Endpoint("fastapi", "http://127.0.0.1:1"))
    for options, refused in [
        ({"concurrency": 0}, "concurrency and length"),
        ({"length": 0}, "concurrency and length"),
        ({"warmup_sequences": -1}, "warmup_sequences"),
        ({"sequences": 0}, "sequences and duration_s must be positive"),
        ({"duration_s": 0}, "sequences and duration_s must be positive"),
        ({"frame_interval_s": 0}, "frame_interval_s"),
    ]:
        with pytest.raises(ValueError, match=refused):
            SequenceLoad(**{"concurrency": 1, "length": 1, **options})


# ---- the real Triton -------------------------------------------------------------------------

requires_food_sequence = pytest.mark.skipif(
    not (paths.MODELS_STAGING_DIR / "food_sequence").is_dir(),
    reason="models_staging/food_sequence (the stateful model of lesson 10) is not in this checkout",
)


@pytest.mark.integration
@requires_food_sequence
@pytest.mark.parametrize("kind", ["triton-http", "triton-grpc"])
def test_triton_answers_every_frame_of_every_sequence(triton_http_url, triton_grpc_url, kind):
    address = triton_http_url if kind == "triton-http" else triton_grpc_url
    result = loadgen.sequence_loop(
        loadgen.Endpoint(kind, address, "food_sequence"), SequenceLoad(3, 4, sequences=6), progress=False
    )
    assert result.errors == {} and result.sequences_failed == {}, result.errors
    assert result.sequences_completed == 6 and result.requests == len(result.latencies_ms) == 24
    assert result.name == f"triton/food_sequence ({kind.split('-')[1]})"
