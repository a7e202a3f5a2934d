"""The headline benchmark: every way the lab serves the model, measured in one run on this machine.

    python -m servelab bench [--profile full|quick] [--out DIR]     (make bench / make bench-quick)

1. The in-process ceilings (servelab.measure.inprocess): for PyTorch and ONNX Runtime, with decoding and
   (ONNX, as Triton's ONNX model serves it) without, the best of a small sweep of thread plans,
   for one request in flight and for many. This machine's speed drifts within minutes, even
   within one run, so each load point is measured in short windows (the profile's `windows`)
   that take turns with the winning plan measured again: a service is compared with the
   ceiling's mean speed in the windows around and between its own.
2. FastAPI PyTorch, FastAPI ONNX, Triton `food_classifier` (Python backend) and Triton
   `food_classifier_onnx`, each at concurrency 1, 8 and 16, with the lab's load generator
   (closed loop), sampling CPU/GPU during each window and reading Triton's statistics over them
   (and, for a FastAPI server whose process id is known, the CPU its process, its event loop and
   the load generator spent: CpuSplit); and the naive reference apps (servelab.bench.naive_app) at
   the highest concurrency. On a server with no GPU, Triton's models run one instance per core
   for their runs (the CPU counterpart of FastAPI's one slot per core), set through the
   repository API and put back afterwards.
3. The load generator against perf_analyzer: at concurrency 8 against `food_classifier_onnx`,
   alternating, with the CPU each tool spent per request.

Writes results.json, report.md (servelab.bench.report) and PNG plots to a new folder under
results/ (git-ignored). Speed is never asserted here: this reports what the machine did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil
import requests
import tritonclient.http as triton_http
from tqdm.contrib.logging import logging_redirect_tqdm
from tritonclient.utils import InferenceServerException

from servelab import loadgen, paths, progress
from servelab.bench import report as bench_report
from servelab.bench.setups import CEILINGS, NAIVE, SETUPS, CpuSplit, ServedSetup, ceiling_key
from servelab.environment import machine_info
from servelab.measure import inprocess
from servelab.measure.resources import ResourceSampler
from servelab.profiles import PROFILES, Profile
from servelab.results import RunResult, pooled, save_results
from servelab.service.cores import available_cores, thread_plan
from servelab.stack import artifacts
from servelab.stack.catalogue import fastapi_service, triton_service
from servelab.stack.supervision import LocalStack, Ports, ServiceSpec
from servelab.triton import perf_analyzer
from servelab.triton import stats as triton_stats
from servelab.triton.models import ModelRepository

log = logging.getLogger(__name__)

AGREEMENT_MODEL = "food_classifier_onnx"
AGREEMENT_CONCURRENCY = 8
# Warm-up of a window after a load point's first, and of the ceiling measured again: the model is
# already loaded (the ceiling's in the process that swept it).
REPEAT_WARMUP_S = 1.0


@dataclass(frozen=True)
class Endpoints:
    fastapi_pt: str  # http://host:port
    fastapi_onnx: str
    triton_http: str  # host:port

    @classmethod
    def of(cls, ports: Ports) -> Endpoints:
        return cls(
            f"http://127.0.0.1:{ports.fastapi_pt}",
            f"http://127.0.0.1:{ports.fastapi_onnx}",
            f"127.0.0.1:{ports.triton_http}",
        )


def address(setup: ServedSetup, endpoints: Endpoints) -> str:
    return {"fastapi_pt": endpoints.fastapi_pt, "fastapi_onnx": endpoints.fastapi_onnx}.get(
        setup.name, endpoints.triton_http
    )


def runtime_versions(endpoints: Endpoints) -> dict:
    versions = {"python": platform.python_version()}
    packages = ("torch", "torchvision", "onnxruntime", "numpy", "fastapi", "uvicorn", "tritonclient", "nvidia-pytriton")
    for package in packages:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    with contextlib.suppress(requests.RequestException, ValueError):
        server = requests.get(f"http://{endpoints.triton_http}/v2", timeout=5).json()
        versions["tritonserver"] = server.get("version", "unknown")
    return versions


def thread_plan_of(setup: ServedSetup, endpoints: Endpoints) -> str:
    """How `setup` uses the cores, as served now: FastAPI says so in /health; a Triton model's
    instances each compute their plan with servelab/cores.py, as done here, and log it."""
    try:
        if not setup.model:
            return requests.get(f"{address(setup, endpoints)}/health", timeout=5).json()["threads"]
        client = triton_http.InferenceServerClient(endpoints.triton_http)
        groups = client.get_model_config(setup.model)["instance_group"]
    except (requests.RequestException, ValueError, KeyError, InferenceServerException) as exc:
        return f"unknown ({type(exc).__name__}: {exc})"
    instances = sum(group["count"] * max(1, len(group.get("gpus") or [])) for group in groups)
    device = "cpu" if all(group.get("kind") == "KIND_CPU" for group in groups) else "cuda"
    return thread_plan(slots=instances, device=device, given_by=f"{instances} instance(s)").describe()


def _cpu_now(pid: int | None) -> CpuSplit | None:
    """CPU seconds so far of the server `pid` (the process, its main thread) and of this process,
    with the clock; None when the id is unknown or its process is gone (the run goes on, and the
    load point is reported without a split)."""
    if pid is None:
        return None
    try:
        process = psutil.Process(pid)
        total = process.cpu_times()
        main = next(thread for thread in process.threads() if thread.id == pid)
    except (psutil.Error, StopIteration):
        log.warning("server process %d is gone: its CPU is not counted; its log says why it stopped", pid)
        return None
    loop = main.user_time + main.system_time
    return CpuSplit(total.user + total.system, loop, time.process_time(), time.perf_counter())


def _window(
    setup: ServedSetup, url: str, concurrency: int, duration_s: float, warmup_s: float, image: bytes
) -> RunResult:
    """One measured window of a load point, with the machine sampled during it."""
    with ResourceSampler() as sampler:
        result = loadgen.closed_loop(
            loadgen.Endpoint(setup.kind, url, setup.model, image),
            loadgen.Load(concurrency, duration_s=duration_s, warmup_s=warmup_s),
        )
    result.name = setup.name
    result.resources = sampler.series()
    return result


def _ceilings(profile: Profile, steps: Any) -> dict[str, inprocess.Ceiling]:
    """Every ceiling's sweep, a step of `steps` each. Half the load points' duration each: the sweep
    has many points."""
    found: dict[str, inprocess.Ceiling] = {}
    try:
        for runtime, decode in CEILINGS:
            for in_flight, pipelined in (("one", False), ("many", True)):
                log.info("in-process ceiling: %s", ceiling_key(runtime, decode, in_flight))
                found[ceiling_key(runtime, decode, in_flight)] = inprocess.sweep(
                    runtime, pipelined, profile.duration_s / 2, profile.warmup_s, decode
                )
                steps.update()
    except BaseException:
        for ceiling in found.values():
            ceiling.close()
        raise
    return found


def _load_point(
    ceilings: dict[str, inprocess.Ceiling],
    served: ServedSetup,
    url: str,
    triton: str,
    concurrency: int,
    profile: Profile,
    image: bytes,
    windows_rps: dict[str, dict[str, dict]],
    server_pid: int | None = None,
) -> RunResult:
    """`served` at `concurrency`, measured in `profile.windows` windows, each between two
    measurements of the ceiling it is judged against (one request in flight at concurrency 1,
    the winner for many otherwise). Returns the windows pooled; records each window's req/s and
    the ceiling's before, between and after them in `windows_rps[served.name][str(concurrency)]`,
    with the windows' CpuSplit when the server's process id is given. The
    point is judged against the ceiling's mean: a slowdown in the middle of the run slows both.

    The first window warms the service up for the profile's warm-up; the later ones, and the
    ceiling measured again, for REPEAT_WARMUP_S (the models are loaded; connections are new)."""
    key = ceiling_key(served.runtime, served.decode, "one" if concurrency == 1 else "many")
    window_s = profile.duration_s / profile.windows

    def ceiling_now(turn: int) -> float:
        where = f"{turn} of {profile.windows + 1} around {served.name} at c={concurrency}"
        log.info("in-process ceiling %s: %s, %s", where, key, ceilings[key].plan.name)
        again = ceilings[key].measure_now(window_s, min(REPEAT_WARMUP_S, profile.warmup_s))
        again.notes.append(f"ceiling: {key} ({where})")
        return again.throughput_rps

    ceiling_rps, windows, splits = [ceiling_now(1)], [], []
    stats = triton_stats.counted_over(triton, served.model) if served.model else contextlib.nullcontext()
    with stats as stats_window:  # the ceiling's windows send Triton nothing
        for turn in range(1, profile.windows + 1):
            log.info("%s at concurrency %d: window %d of %d", served.name, concurrency, turn, profile.windows)
            warmup_s = profile.warmup_s if turn == 1 else min(REPEAT_WARMUP_S, profile.warmup_s)
            before = _cpu_now(server_pid)
            windows.append(_window(served, url, concurrency, window_s, warmup_s, image))
            after = _cpu_now(server_pid)
            splits.append(after - before if before and after else None)
            ceiling_rps.append(ceiling_now(turn + 1))
    result = pooled(windows)
    # The machine as sampled in the last window: a sampler across all of them would see the ceiling's too.
    result.resources = windows[-1].resources
    result.notes.append("resources: sampled during the last window")
    if stats_window is not None:  # counted_over's, when Triton served this setup
        assert stats_window.delta is not None, "set as the block ended without an error"
        result.triton_stats = stats_window.delta.to_dict()
    served_rps = [window.throughput_rps for window in windows]
    point: dict[str, Any] = {"served_rps": served_rps, "ceiling_rps": ceiling_rps}
    measured_splits = [split for split in splits if split is not None]
    if measured_splits and len(measured_splits) == len(splits):
        point["cpu_s"] = asdict(sum(measured_splits, CpuSplit()))
    windows_rps.setdefault(served.name, {})[str(concurrency)] = point
    return result


@contextlib.contextmanager
def one_instance_per_core(triton: str, model: str) -> Iterator[None]:
    """Serve `model` with one instance per core while the block runs, when its instances are on
    the CPU (the local stack); as configured otherwise. Served as before after the block."""
    client = triton_http.InferenceServerClient(triton)
    config = client.get_model_config(model)
    if any(group.get("kind") != "KIND_CPU" for group in config.get("instance_group", [])):
        yield
        return
    per_core = {**config, "instance_group": [{"count": available_cores(), "kind": "KIND_CPU"}]}
    client.load_model(model, config=json.dumps(per_core))
    try:
        yield
    finally:
        # The served config, given back as an override too: a plain load would be skipped, since
        # the files on disk did not change.
        client.load_model(model, config=json.dumps(config))


def _naive(
    profile: Profile,
    image: bytes,
    log_dir: Path,
    ceilings: dict[str, inprocess.Ceiling],
    windows_rps: dict,
    steps: Any,
) -> list[RunResult]:
    """The naive reference apps at the highest concurrency, each started for its run, each
    judged as the lab's services are (into `windows_rps`)."""
    results = []
    concurrency = max(profile.concurrencies)
    for runtime, name in NAIVE.items():
        port = Ports.found_free().fastapi_pt
        command = [sys.executable, "-m", "uvicorn", "servelab.bench.naive_app:app", "--host", "127.0.0.1"]
        spec = ServiceSpec(
            name.replace("/", "_"), [*command, "--port", str(port)], paths.REPO_ROOT, [port],
            f"http://127.0.0.1:{port}/health", env={"NAIVE_RUNTIME": runtime},
        )  # fmt: skip
        setup = ServedSetup(name, "fastapi", None, runtime)
        with LocalStack([spec], log_dir=log_dir) as stack:
            url = f"http://127.0.0.1:{port}"
            pid = stack.pids()[spec.name]
            results.append(_load_point(ceilings, setup, url, "", concurrency, profile, image, windows_rps, pid))
            steps.update()
    return results


def _counted(run, triton: str) -> tuple[RunResult, int, float, float]:
    """Run `run()`; return its result, the requests Triton answered meanwhile, and the CPU
    seconds this process and its finished children spent meanwhile."""
    own, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with triton_stats.counted_over(triton, AGREEMENT_MODEL) as stats:
        result = run()
    assert stats.delta is not None, "set as the block ended without an error"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_s = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
    return result, stats.delta.success_count + stats.delta.fail_count, time.process_time() - own, child_s


def agreement_gaps(generator: list[RunResult], reference: list[RunResult]) -> dict:
    """The load generator over perf_analyzer, pair by pair (each pair ran back to back, at one
    machine speed), and each measure's gap: how far the median pair is from 1. The medians of each
    tool's runs would compare runs made minutes apart, at whatever speed the machine had then."""
    pairs = list(zip(generator, reference, strict=True))
    ratios = {
        "throughput": [ours.throughput_rps / theirs.throughput_rps for ours, theirs in pairs],
        "p50": [ours.latency.p50_ms / theirs.latency.p50_ms for ours, theirs in pairs],
    }
    gaps = {f"{measure}_gap": abs(statistics.median(values) - 1) for measure, values in ratios.items()}
    return {**gaps, "pair_ratios": ratios}


def _agreement(endpoints: Endpoints, profile: Profile, image: bytes) -> dict:
    """The load generator and perf_analyzer, alternately, against the same model at the same load.

    Single runs on a busy 2-core machine differ by more than the tolerances, whoever measures,
    so the tools take turns `profile.agreement_pairs` times, and are compared pair by pair
    (`agreement_gaps`). Each
    run's CPU is divided by the requests Triton answered during it (warm-up and every trial
    window included), so the two tools' costs per request compare fairly.
    """
    generator, reference, generator_cpu, reference_cpu = [], [], [], []
    for _ in range(profile.agreement_pairs):
        result, answered, own_s, _ = _counted(
            lambda: loadgen.closed_loop(
                loadgen.Endpoint("triton-http", endpoints.triton_http, AGREEMENT_MODEL, image),
                loadgen.Load(AGREEMENT_CONCURRENCY, duration_s=profile.duration_s / 2, warmup_s=profile.warmup_s),
                progress=False,
            ),
            endpoints.triton_http,
        )  # fmt: skip
        generator.append(result)
        generator_cpu.append(own_s / answered)
        result, answered, _, child_s = _counted(
            lambda: perf_analyzer.run(
                endpoints.triton_http, AGREEMENT_MODEL, concurrency=AGREEMENT_CONCURRENCY,
                measurement_interval_ms=int(profile.duration_s * 1000 / 4), stability_percentage=25,
                **ModelRepository().get(AGREEMENT_MODEL).perf_analyzer_input(image, paths.LAB_DIR),
            ).results[0],
            endpoints.triton_http,
        )  # fmt: skip
        reference.append(result)
        reference_cpu.append(child_s / answered)

    def medians(runs: list[RunResult], cpu: list[float]) -> dict:
        return {
            "throughput_rps": statistics.median(r.throughput_rps for r in runs),
            "p50_ms": statistics.median(r.latency.p50_ms for r in runs),
            "cpu_ms_per_request": 1000 * statistics.median(cpu),
        }

    return {
        "model": AGREEMENT_MODEL,
        "concurrency": AGREEMENT_CONCURRENCY,
        "pairs": profile.agreement_pairs,
        "loadgen": medians(generator, generator_cpu),
        "perf_analyzer": medians(reference, reference_cpu),
        **agreement_gaps(generator, reference),
        "runs": {"loadgen": [r.to_dict() for r in generator], "perf_analyzer": [r.to_dict() for r in reference]},
    }


def run_benchmark(
    profile_name: str = "full",
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
    profile = PROFILES[profile_name]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or paths.RESULTS_DIR / f"bench-{stamp}-{profile_name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    built = artifacts.ensure_artifacts()
    image = paths.SAMPLE_IMAGE.read_bytes()

    # A bar over its steps where someone watches, the ETA from the steps done so far (the log's lines
    # go above it): every ceiling's sweep, load point and naive app, and the agreement pairs.
    total = 2 * len(CEILINGS) + len(SETUPS) * len(profile.concurrencies) + 1 + len(NAIVE)
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
    ceilings: dict[str, inprocess.Ceiling],
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
                    started = time.time()
                    point = _load_point(ceilings, setup, url, triton, concurrency, profile, image, windows_rps, pid)
                    # A server the local stack restarted during the point: its figures are not a clean run's.
                    point.interrupted_by = [e.describe() for e in exits if e.between(started, time.time())]
                    results.append(point)
                    steps.update()
        log.info("load generator vs perf_analyzer, %d alternating pairs", profile.agreement_pairs)
        agreement = _agreement(endpoints, profile, image)
        steps.update()
        meta = {
            "profile": profile.name,
            "profile_settings": {
                "duration_s": profile.duration_s,
                "warmup_s": profile.warmup_s,
                "windows": profile.windows,
            },
            "machine": {**machine_info(), "cores_available": available_cores()},
            "versions": runtime_versions(endpoints),
            "weights": built.weights_info,
            "payload": {"image": paths.SAMPLE_IMAGE.name, "bytes": len(image)},
            "thread_plans": plans,
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
    out_dir = run_benchmark(args.profile, args.out)
    print((out_dir / "report.md").read_text(), file=sys.stderr)
    return 0
