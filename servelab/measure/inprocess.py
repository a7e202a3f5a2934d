"""The in-process ceiling: what this machine can do with no server, no HTTP and no queue in front.

The same work a service does per request (base64 decode, image decode, preprocessing, a batch-1
forward pass) runs in one process, with the model built and run as the services do it (a thread
plan, servelab/service/cores.py; the model proved by one inference, devices.py). Two kinds of run:
one request in flight (one thread decodes, then infers: no server at concurrency 1 can beat it),
and a pipeline (decoding threads feed `slots` inference threads, as in the best possible server
under load; `decoding_threads` says how many). One Python process does only what its interpreter
lock lets through, so a point may also run in several processes at once (`Point.processes`), as a
service of several processes runs: their figures add up to the machine's ceiling.

The ceiling itself, the best of a sweep of such points, is servelab.measure.ceilings's (`sweep`).

    python -m servelab.measure.inprocess --runtime pytorch --slots 2 --threads 1 --duration 10
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

import numpy as np

from food11 import decode_base64_image, preprocess
from servelab import paths
from servelab.results import LatencySummary, RunResult, at_once
from servelab.service.cores import ThreadPlan, available_cores, thread_plan
from servelab.service.devices import Placement, onnx_session, torch_model
from servelab.settings import settings

log = logging.getLogger(__name__)

RUNTIMES = ("onnxruntime", "pytorch")


def load_model(runtime: str, plan: ThreadPlan) -> tuple[Callable[[np.ndarray], np.ndarray], Placement]:
    """The model as the matching FastAPI service builds it, for `plan`: (batch -> logits, where it
    runs, as the runtime reports it once it has run one inference). Call it on the thread that will
    run the model (an inference thread). INFERENCE_DEVICE chooses the device, as in the services."""
    setting = settings().inference_device
    if runtime == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = plan.threads
        options.inter_op_num_threads = 1
        session, placement = onnx_session(paths.ARTIFACTS_DIR / "food11.onnx", options, setting)
        return (lambda batch: session.run(["output"], {"input": batch})[0]), placement
    if runtime == "pytorch":
        import torch

        model, placement = torch_model(paths.ARTIFACTS_DIR / "food11.pth", setting)
        torch.set_num_threads(plan.threads)  # after torch_model: its first inference had every core
        return model, placement
    raise ValueError(f"unknown runtime {runtime!r}; choose one of {RUNTIMES}")


def decoding_threads(device: str, point: Point, decode: bool = True, cores: int | None = None) -> int:
    """The threads that feed `point`'s inference threads when the model runs on `device` ("cpu"
    or "cuda"): none for one request in flight (its one thread decodes), one per slot on a CPU (the
    inference threads need the other cores), every core on a GPU when they decode, as the services
    do: there decoding is the CPU's main work, and fewer threads would cap the ceiling below a service."""
    if not point.pipelined:
        return 0
    if decode and device.startswith("cuda"):
        return max(point.slots, cores or available_cores())
    return point.slots


@dataclass(frozen=True)
class Point:
    """One run of the sweep: a thread plan, and whether decoding overlaps inference."""

    slots: int
    threads: int
    pipelined: bool  # False: one request in flight, decode then infer on one thread
    processes: int = 1  # processes that run it at once, each on its share of the cores

    @property
    def name(self) -> str:
        shape = "pipeline" if self.pipelined else "one in flight"
        each = f"{self.processes} processes, each " if self.processes > 1 else ""
        return f"{shape}, {each}{self.slots} slot(s) x {self.threads} thread(s)"


class PointRunner:
    """One point's model, built once from its inference thread as the services build it, and
    measured as often as asked, in this process.

    With decode=False the image is decoded once and only inference is repeated: the ceiling for
    a server that receives tensors its clients preprocessed (Triton's ONNX model).
    """

    def __init__(self, runtime: str, image_bytes: bytes, point: Point, decode: bool = True) -> None:
        self.runtime, self.point, self.decode = runtime, point, decode
        plan = thread_plan(slots=point.slots, threads=point.threads, given_by="the sweep")
        self.encoded = base64.b64encode(image_bytes).decode()
        self.decoded_once = preprocess(decode_base64_image(self.encoded))[np.newaxis]
        self.slots = ThreadPoolExecutor(point.slots, thread_name_prefix="inference")
        self.model, self.placement = self.slots.submit(load_model, runtime, plan).result()  # on an inference thread

    def close(self) -> None:
        self.slots.shutdown()

    def _prepared(self) -> tuple[np.ndarray, float]:
        if not self.decode:
            return self.decoded_once, 0.0
        started = time.perf_counter()
        return preprocess(decode_base64_image(self.encoded))[np.newaxis], time.perf_counter() - started

    def run(self, duration_s: float, warmup_s: float) -> RunResult:
        """Warm up for warmup_s, then measure for duration_s (or until one image is done, if later)."""
        point = self.point
        ready: queue.Queue = queue.Queue(maxsize=2 * point.slots)
        stop = threading.Event()
        measure_from = time.perf_counter() + warmup_s
        measure_until = measure_from + duration_s
        service_ms: list[list[float]] = [[] for _ in range(point.slots)]

        def decode_loop() -> None:
            while not stop.is_set():
                item = self._prepared()
                while not stop.is_set():
                    try:
                        ready.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue

        def inference_loop(slot: int) -> None:
            # Past the window only until something is measured: a machine busy with other work can
            # take longer than a short window for one image.
            while (now := time.perf_counter()) < measure_until or not any(service_ms):
                tensor, decode_s = ready.get() if point.pipelined else self._prepared()
                started = time.perf_counter()
                self.model(tensor)
                if now >= measure_from:
                    # Per-image work without waiting: the floor under any service's latency.
                    service_ms[slot].append((decode_s + time.perf_counter() - started) * 1000)

        feeding = decoding_threads(self.placement.device, point, self.decode, available_cores() // point.processes)
        decoders = [threading.Thread(target=decode_loop, daemon=True) for _ in range(feeding)]
        for thread in decoders:
            thread.start()
        try:
            list(self.slots.map(inference_loop, range(point.slots)))
        finally:
            stop.set()
            for thread in decoders:
                thread.join(timeout=5)
        latencies = [value for values in service_ms for value in values]
        measured_s = time.perf_counter() - measure_from
        what = "decode + inference" if self.decode else "inference only, on an image decoded once"
        return RunResult(
            name=f"in-process/{self.runtime}" + ("" if self.decode else " (inference only)"),
            tool="in-process",
            mode="closed",
            requests=len(latencies),
            throughput_rps=len(latencies) / measured_s,
            latency=LatencySummary.of(latencies),
            wall_s=measured_s,
            concurrency=point.slots if point.pipelined else 1,
            latencies_ms=latencies,
            notes=[
                f"{point.name} (on {self.placement.describe()}"
                + (f", {len(decoders)} decoding thread(s)" if self.decode and decoders else "")
                + f"); {what}; latency is the work per image, without queueing",
                *([self.placement.fallback_warning()] if self.placement.fallback is not None else []),
            ],
        )


RESULT_MARK = "in-process result: "  # before the JSON line a point's process answers with


class PointProcess:
    """A point run in Python processes of its own (`point.processes` of them), so that no other
    plan's threads are around; each builds the model once and measures it each time it is asked
    (`measure`), all at once, until `close`. A context manager."""

    def __init__(
        self, runtime: str, point: Point, decode: bool = True, timeout_s: float = 300, device: str | None = None
    ) -> None:
        """`device` ("cuda" or "cpu") is the INFERENCE_DEVICE its processes get; None: this process's."""
        self.point, self.timeout_s = point, timeout_s
        env = None if device is None else {**os.environ, "INFERENCE_DEVICE": device}
        command = [sys.executable, "-m", "servelab.measure.inprocess", "--serve", f"--runtime={runtime}"]
        command += [f"--slots={point.slots}", f"--threads={point.threads}", f"--processes={point.processes}"]
        command += ([] if point.pipelined else ["--one-in-flight"]) + ([] if decode else ["--inference-only"])
        self.errors = tempfile.TemporaryFile(mode="w+")  # a runtime's warnings; read back when one fails
        self.processes = [
            subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.errors,
                text=True,
                cwd=paths.REPO_ROOT,
                env=env,
            )
            for _ in range(point.processes)
        ]
        self.lines: list[queue.Queue] = []
        for process in self.processes:
            assert process.stdout is not None, "a pipe"
            self.lines.append(queue.Queue())
            threading.Thread(target=self._read, args=(process.stdout, self.lines[-1]), daemon=True).start()

    @staticmethod
    def _read(answers: IO[str], lines: queue.Queue) -> None:
        for line in answers:
            lines.put(line)
        lines.put(None)  # the process has ended

    def measure(self, duration_s: float, warmup_s: float) -> RunResult:
        """The point measured now, in all its processes at once: warmed up for warmup_s, then
        measured for duration_s; their figures added up."""
        for process in self.processes:
            assert process.stdin is not None, "a pipe"
            process.stdin.write(json.dumps({"duration_s": duration_s, "warmup_s": warmup_s}) + "\n")
            process.stdin.flush()
        deadline = time.monotonic() + self.timeout_s
        return combined([self._answer(lines, deadline) for lines in self.lines], self.point)

    def _answer(self, lines: queue.Queue, deadline: float) -> RunResult:
        while True:  # a runtime may print before the answer (ONNX Runtime, when it drops a provider)
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.close()
                self.errors.seek(0)
                raise RuntimeError(f"in-process run {self.point.name} failed:\n{self.errors.read()[-2000:]}")
            if line.startswith(RESULT_MARK):
                return RunResult.from_dict(json.loads(line.removeprefix(RESULT_MARK)))

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                assert process.stdin is not None, "a pipe"
                process.stdin.close()  # the process ends at the end of its input
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if not self.errors.closed:
            self.errors.close()

    def __enter__(self) -> PointProcess:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def combined(runs: list[RunResult], point: Point) -> RunResult:
    """The runs of a point's processes, measured at once, as one (results.at_once)."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    return at_once(
        runs, [f"{len(runs)} processes at once, their figures added up; each: {first.notes[0]}"] + first.notes[1:]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.measure.inprocess", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runtime", choices=RUNTIMES, required=True)
    parser.add_argument("--slots", type=int, default=1, help="inference threads running at once")
    parser.add_argument("--threads", type=int, default=1, help="threads per inference (intra-op)")
    parser.add_argument("--processes", type=int, default=1, help="processes that run this point at once (cores shared)")
    parser.add_argument("--one-in-flight", action="store_true", help="decode then infer on one thread, no overlap")
    parser.add_argument("--inference-only", action="store_true", help="decode once, repeat only the inference")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--serve", action="store_true", help="measure for each line on stdin: {duration_s, warmup_s}")
    args = parser.parse_args(argv)
    point = Point(args.slots, args.threads, pipelined=not args.one_in_flight, processes=args.processes)
    runner = PointRunner(args.runtime, paths.SAMPLE_IMAGE.read_bytes(), point, decode=not args.inference_only)
    once = [{"duration_s": args.duration, "warmup_s": args.warmup}]
    try:
        for asked in (json.loads(line) for line in sys.stdin) if args.serve else once:
            result = runner.run(asked["duration_s"], asked["warmup_s"])
            print(RESULT_MARK + json.dumps(result.to_dict()), flush=True)
    finally:
        runner.close()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(main())
