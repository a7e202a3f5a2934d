"""The headline benchmark: every way the lab serves the model, measured in one run on this machine.

    python -m servelab bench [--profile full|quick] [--out DIR]     (make bench / make bench-quick)

1. The in-process ceilings (servelab.measure.ceilings): for PyTorch and ONNX Runtime, with decoding and
   (ONNX, as Triton's ONNX model serves it) without, the best of a small sweep of thread plans,
   for one request in flight and for many. This machine's speed drifts within minutes, even
   within one run, so each load point is measured in short windows (the profile's `windows`)
   that take turns with the winning plan measured again: a service is compared with the
   ceiling's mean speed in the windows around and between its own.
2. FastAPI PyTorch, FastAPI ONNX, Triton `food_classifier` (Python backend) and Triton
   `food_classifier_onnx`, each at the profile's concurrencies (full: 1, 8, 16 and 64), with the
   lab's load generator (closed loop, in this process: its CPU over each point is counted, and a
   point where it was near a full core is marked saturated), sampling CPU/GPU during each window
   and reading over them Triton's statistics, or a FastAPI service's own account (each of its
   processes' connections and requests), and, for a FastAPI server whose process id is known, the
   CPU its process, its event loop and the load generator spent (CpuSplit); and the naive
   reference apps (servelab.bench.naive_app) at the highest concurrency. On a server with no GPU,
   Triton's models run one instance per core for their runs (the CPU counterpart of FastAPI's one
   slot per core), set through the repository API and put back afterwards.
   Before those, each FastAPI service's lone client, fresh and right after a load, against the in-process
   loop measured beside it (servelab.bench.lone).
3. The load generator against perf_analyzer: at concurrency 8 against `food_classifier_onnx`,
   alternating, with the CPU each tool spent per request (servelab.bench.agreement).

Writes results.json, report.md (servelab.bench.report) and PNG plots to a new folder under
results/ (git-ignored). Speed is never asserted here: this reports what the machine did.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from tqdm.contrib.logging import logging_redirect_tqdm

from servelab import loadgen, paths, progress
from servelab.bench import lone
from servelab.bench import report as bench_report
from servelab.bench.agreement import measure_agreement
from servelab.bench.served import Endpoints, address, one_instance_per_core, runtime_versions, thread_plan_of
from servelab.bench.setups import CEILINGS, NAIVE, SETUPS, CpuSplit, ServedSetup, ceiling_key
from servelab.loadgen.processes import client_record
from servelab.measure import service_stats
from servelab.measure.ceilings import Ceiling, sweep
from servelab.measure.resources import ResourceSampler
from servelab.profiles import PROFILES, Profile
from servelab.results import RunResult, pooled, save_results
from servelab.service.cores import available_cores
from servelab.service.hardware import machine_info
from servelab.stack import artifacts
from servelab.stack.catalogue import fastapi_service, naive_service, triton_service
from servelab.stack.supervision import LocalStack, Ports
from servelab.triton import stats as triton_stats

log = logging.getLogger(__name__)

# The FastAPI services, each measured alone before and after a load (servelab.bench.lone).
LONE = tuple(setup for setup in SETUPS if setup.kind == "fastapi")
# Warm-up of a window after a load point's first, and of the ceiling measured again: the model is
# already loaded (the ceiling's in the process that swept it).
REPEAT_WARMUP_S = 1.0


def _cpu_now(pid: int | None) -> CpuSplit | None:
    """CPU seconds so far of the server `pid` with its child processes (uvicorn's workers, where
    the service runs several: a process's own times leave its living children out) and of their
    main threads (each worker's event loop), of this process, with the clock; None when the id is
    unknown or its process is gone (the run goes on, and the load point is reported without a split)."""
    if pid is None:
        return None
    server_s = loop_s = 0.0
    try:
        leader = psutil.Process(pid)
        family = [leader, *leader.children(recursive=True)]
    except psutil.Error:
        log.warning("server process %d is gone: its CPU is not counted; its log says why it stopped", pid)
        return None
    for process in family:
        try:
            total = process.cpu_times()
            main = next(thread for thread in process.threads() if thread.id == process.pid)
        except (psutil.Error, StopIteration):  # a worker that ended since: its time is gone with it
            continue
        server_s += total.user + total.system
        loop_s += main.user_time + main.system_time
    return CpuSplit(server_s, loop_s, time.process_time(), time.perf_counter())


def _window(
    setup: ServedSetup, url: str, concurrency: int, duration_s: float, warmup_s: float, image: bytes
) -> tuple[RunResult, float, float]:
    """One measured window of a load point, with the machine sampled during it; and this process's
    CPU seconds (the load generator's, the sampler's) and the wall seconds from the warm-up's end to
    the window's, as the GPU check's clients measure theirs."""
    measuring: list[float] = []  # the CPU and wall clocks as measurement starts
    with ResourceSampler() as sampler:
        result = loadgen.closed_loop(
            loadgen.Endpoint(setup.kind, url, setup.model, image),
            loadgen.Load(concurrency, duration_s=duration_s, warmup_s=warmup_s),
            on_measuring=lambda: measuring.extend((time.process_time(), time.perf_counter())),
        )
        cpu_s, wall_s = time.process_time() - measuring[0], time.perf_counter() - measuring[1]
    result.name = setup.name
    result.resources = sampler.series()
    return result, cpu_s, wall_s


def client_use(cpu_s: float, wall_s: float) -> dict[str, Any]:
    """A load point's `RunResult.client`: the load generator, one process (this one), its CPU over the
    measured windows as a share of one core, saturated at the GPU check's threshold."""
    return client_record([round(100 * cpu_s / wall_s, 1)])


def _ceilings(profile: Profile, steps: Any) -> dict[str, Ceiling]:
    """Every ceiling's sweep, a step of `steps` each. Half the load points' duration each: the sweep
    has many points."""
    found: dict[str, Ceiling] = {}
    try:
        for runtime, decode in CEILINGS:
            for in_flight, pipelined in (("one", False), ("many", True)):
                log.info("in-process ceiling: %s", ceiling_key(runtime, decode, in_flight))
                found[ceiling_key(runtime, decode, in_flight)] = sweep(
                    runtime, pipelined, profile.duration_s / 2, profile.warmup_s, decode
                )
                steps.update()
    except BaseException:
        for ceiling in found.values():
            ceiling.close()
        raise
    return found


def _load_point(
    ceilings: dict[str, Ceiling],
    served: ServedSetup,
    url: str,
    triton: str,
    concurrency: int,
    profile: Profile,
    image: bytes,
    windows_rps: dict[str, dict[str, dict]],
    server_pid: int | None = None,
    metrics_url: str | None = None,
) -> RunResult:
    """`served` at `concurrency`, in `profile.windows` windows, each between two measurements of its
    ceiling (one request in flight at concurrency 1, the winner for many otherwise), which it is
    judged against on their mean: a slowdown in the middle of the run slows both. Returns the windows
    pooled, with the load generator's CPU and, given a `metrics_url`, the FastAPI service's own count
    of each process's connections and requests; records each window's req/s, the ceiling's around
    them and, given the server's pid, their CpuSplit in `windows_rps[served.name][str(concurrency)]`.
    The first window warms up for the profile's warm-up; the rest, and the ceiling's, for REPEAT_WARMUP_S."""
    key = ceiling_key(served.runtime, served.decode, "one" if concurrency == 1 else "many")
    window_s = profile.duration_s / profile.windows

    def ceiling_now(turn: int) -> float:
        where = f"{turn} of {profile.windows + 1} around {served.name} at c={concurrency}"
        log.info("in-process ceiling %s: %s, %s", where, key, ceilings[key].plan.name)
        again = ceilings[key].measure_now(window_s, min(REPEAT_WARMUP_S, profile.warmup_s))
        again.notes.append(f"ceiling: {key} ({where})")
        return again.throughput_rps

    ceiling_rps, windows, splits = [ceiling_now(1)], [], []
    client_cpu_s = client_wall_s = 0.0
    # Counted over all the windows: the ceiling's windows send the services nothing.
    with contextlib.ExitStack() as counting:
        stats_window = counting.enter_context(triton_stats.counted_over(triton, served.model)) if served.model else None
        service_window = counting.enter_context(service_stats.counted_over(metrics_url)) if metrics_url else None
        for turn in range(1, profile.windows + 1):
            log.info("%s at concurrency %d: window %d of %d", served.name, concurrency, turn, profile.windows)
            warmup_s = profile.warmup_s if turn == 1 else min(REPEAT_WARMUP_S, profile.warmup_s)
            before = _cpu_now(server_pid)
            window, cpu_s, wall_s = _window(served, url, concurrency, window_s, warmup_s, image)
            windows.append(window)
            client_cpu_s, client_wall_s = client_cpu_s + cpu_s, client_wall_s + wall_s
            after = _cpu_now(server_pid)
            splits.append(after - before if before and after else None)
            ceiling_rps.append(ceiling_now(turn + 1))
    result = pooled(windows)
    result.client = client_use(client_cpu_s, client_wall_s)
    # The machine as sampled in the last window: a sampler across all of them would see the ceiling's too.
    result.resources = windows[-1].resources
    result.notes.append("resources: sampled during the last window")
    if stats_window is not None:  # counted_over's, when Triton served this setup
        assert stats_window.delta is not None, "set as the block ended without an error"
        result.triton_stats = stats_window.delta.to_dict()
    if service_window is not None:
        assert service_window.delta is not None, "set as the block ended without an error"
        result.service_stats = service_window.delta.to_dict()
    served_rps = [window.throughput_rps for window in windows]
    point: dict[str, Any] = {"served_rps": served_rps, "ceiling_rps": ceiling_rps}
    measured_splits = [split for split in splits if split is not None]
    if measured_splits and len(measured_splits) == len(splits):
        point["cpu_s"] = asdict(sum(measured_splits, CpuSplit()))
    windows_rps.setdefault(served.name, {})[str(concurrency)] = point
    return result


def _naive(
    profile: Profile,
    image: bytes,
    log_dir: Path,
    ceilings: dict[str, Ceiling],
    windows_rps: dict,
    steps: Any,
) -> list[RunResult]:
    """The naive reference apps at the highest concurrency, each started for its run, each
    judged as the lab's services are (into `windows_rps`)."""
    results = []
    concurrency = max(profile.concurrencies)
    for runtime, name in NAIVE.items():
        port = Ports.found_free().fastapi_pt
        spec = naive_service(runtime, port)
        setup = ServedSetup(name, "fastapi", None, runtime)
        with LocalStack([spec], log_dir=log_dir) as stack:
            url = f"http://127.0.0.1:{port}"
            pid = stack.pids()[spec.name]
            results.append(_load_point(ceilings, setup, url, "", concurrency, profile, image, windows_rps, pid))
            steps.update()
    return results


def run_benchmark(
    profile: Profile,
    out_dir: Path | None = None,
    endpoints: Endpoints | None = None,
    server_pids: dict[str, int] | None = None,
) -> Path:
    """Run the whole benchmark and write its report; returns the report folder.

    With `endpoints`, the services already running there are measured, and `server_pids` (the
    FastAPI services' process ids, by name, when they run on this machine) lets the report say
    where their CPU went; without, the local stack is started on free ports for the run and
    stopped after it.
    """
    server_pids = dict(server_pids or {})
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or paths.RESULTS_DIR / f"bench-{stamp}-{profile.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    built = artifacts.ensure_artifacts()
    image = paths.SAMPLE_IMAGE.read_bytes()

    # A bar over its steps where someone watches, the ETA from the steps done so far (the log's lines
    # go above it): every ceiling's sweep, load point and naive app, and the agreement pairs.
    total = 2 * len(CEILINGS) + len(LONE) + len(SETUPS) * len(profile.concurrencies) + 1 + len(NAIVE)
    with progress.bar("benchmark", total, "step", smoothing=0) as steps, logging_redirect_tqdm():
        # The ceilings first, before any load: in-process work has the machine to itself. Each winner's
        # process stays to measure it again beside every load point, and ends with the benchmark.
        ceilings = _ceilings(profile, steps)
        try:
            return _measure_and_report(profile, out_dir, endpoints, server_pids, built, image, ceilings, steps)
        finally:
            for ceiling in ceilings.values():
                ceiling.close()


def _measure_and_report(
    profile: Profile,
    out_dir: Path,
    endpoints: Endpoints | None,
    server_pids: dict[str, int],
    built: artifacts.BuiltArtifacts,
    image: bytes,
    ceilings: dict[str, Ceiling],
    steps: Any,
) -> Path:
    with contextlib.ExitStack() as cleanup:
        stack = None
        if endpoints is None:
            ports = Ports.found_free()
            stack = LocalStack(
                [
                    fastapi_service("pt", ports.fastapi_pt),
                    fastapi_service("onnx", ports.fastapi_onnx),
                    # Staged models go to a scratch folder: the report folder keeps results only.
                    triton_service(ports.triton, work_dir=Path(cleanup.enter_context(tempfile.TemporaryDirectory()))),
                ],
                log_dir=out_dir / "logs",
            )
            server_pids = cleanup.enter_context(stack).pids()
            endpoints = Endpoints.of(ports)
        # The local stack's crashes (it restarts a server that dies); none is seen of services run elsewhere.
        exits = stack.exits if stack else []

        # A lone client before and after a load, first: before any other load point reaches the services.
        lone_after_load = {}
        for setup in LONE:
            log.info("%s: a lone client, a load, a lone client again, the in-process loop", setup.name)
            lone_after_load[setup.name] = lone.measure(address(setup, endpoints), setup.runtime, profile, image)
            steps.update()
        results: list[RunResult] = []
        # served setup -> concurrency -> its windows' req/s, and the ceiling's around them
        windows_rps: dict[str, dict[str, dict]] = {}
        plans = {}
        for setup in SETUPS:
            served_as = (
                one_instance_per_core(endpoints.triton_http, setup.model) if setup.model else contextlib.nullcontext()
            )
            with served_as:
                plans[setup.name] = thread_plan_of(setup, endpoints)
                for concurrency in profile.concurrencies:
                    url = address(setup, endpoints)
                    triton = endpoints.triton_http
                    # FastAPI's: Triton's HTTP front end is C++ and its models run in processes of their own.
                    pid = None if setup.model else server_pids.get(setup.name)
                    metrics = None if setup.model else url  # each FastAPI process counts its own share
                    started = time.time()
                    point = _load_point(
                        ceilings, setup, url, triton, concurrency, profile, image, windows_rps, pid, metrics
                    )
                    # A server the local stack restarted during the point: its figures are not a clean run's.
                    point.interrupted_by = [e.describe() for e in exits if e.between(started, time.time())]
                    results.append(point)
                    steps.update()
        log.info("load generator vs perf_analyzer, %d alternating pairs", profile.agreement_pairs)
        agreement = measure_agreement(endpoints, profile, image)
        steps.update()
        meta = {
            "profile": profile.name,
            "profile_settings": {key: getattr(profile, key) for key in ("duration_s", "warmup_s", "windows")},
            "machine": {**machine_info(), "cores_available": available_cores()},
            "versions": runtime_versions(endpoints),
            "weights": built.weights_info,
            "payload": {"image": paths.SAMPLE_IMAGE.name, "bytes": len(image)},
            "thread_plans": plans,
            "lone_after_load": lone_after_load,
            "agreement": agreement,
        }
    results += _naive(profile, image, out_dir / "logs", ceilings, windows_rps, steps)
    for key, ceiling in ceilings.items():
        for point in ceiling.points:
            if not any(note.startswith("ceiling: ") for note in point.notes):
                point.notes.append(f"ceiling: {key}" + (" (best)" if point is ceiling.best else ""))
            results.append(point)
    meta["sweep_best_rps"] = {key: ceiling.best.throughput_rps for key, ceiling in ceilings.items()}
    meta["windows_rps"] = windows_rps
    meta["ceilings_rps"] = {
        name: {load: statistics.mean(point["ceiling_rps"]) for load, point in by_load.items()}
        for name, by_load in windows_rps.items()
    }
    save_results(results, out_dir / "results.json", meta)
    bench_report.write_report(results, meta, out_dir)
    log.info("benchmark report: %s", out_dir / "report.md")
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--out", type=Path, help="report folder (default: results/bench-<time>-<profile>)")
    args = parser.parse_args(argv)
    out_dir = run_benchmark(PROFILES[args.profile], args.out)
    print((out_dir / "report.md").read_text(), file=sys.stderr)
    return 0
