"""The GPU check itself, the steps servelab.bench.gpu_check lists: what this machine lacks, whether it
has a GPU, every service started, judged, loaded and stopped, the ceilings measured, the report printed
and written; and its command line (`main`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import tempfile
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests
from tqdm.contrib.logging import logging_redirect_tqdm

from servelab import paths, progress
from servelab.bench import gpu_check
from servelab.bench.gpu_check.machine import (
    gpu_memory_by_pid,
    look_for_gpus,
    machine_line,
    no_gpu_message,
    nvidia_smi_gpus,
)
from servelab.bench.gpu_check.report import CEILING_RUNTIME, Ceiling, Checked, every_run_table, report
from servelab.bench.gpu_check.triton_alone import TRITON_MODEL, find_tritonserver, triton_service
from servelab.bench.gpu_check.verdicts import (
    FAIL,
    NOT_RUN,
    REFERENCE,
    Verdict,
    judge_load,
    judge_service,
    judge_triton,
    onnx_runtime_without_gpu,
    triton_instances,
)
from servelab.loadgen.processes import last_line, load_point
from servelab.loadgen.targets import FastAPITarget, HttpTarget
from servelab.measure.ceilings import sweep
from servelab.measure.resources import ResourceSampler, summarize
from servelab.results import save_results
from servelab.service.cores import available_cores
from servelab.stack.catalogue import fastapi_service, naive_service
from servelab.stack.ports import Ports
from servelab.stack.supervision import ManagedProcess, ServiceSpec, StackError

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_CANNOT_RUN = 2
CONCURRENCIES = (1, 16, 64)
SERVICES = ("fastapi_pt", "fastapi_onnx", "naive_pt", "triton")
READY_TIMEOUT_S = 180.0  # a FastAPI service's start: its model loaded and a first inference run on the device


@dataclass
class Started:
    """A service the check started (servelab.stack.supervision), the request its load sends, and why
    it is not ready (None once it is)."""

    process: ManagedProcess
    request: HttpTarget
    not_ready: str | None = None

    @property
    def name(self) -> str:
        return self.process.spec.name


def cannot_run(services: Sequence[str]) -> str | None:
    """What this machine lacks for the check (a package, a model file), or None."""
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"{', '.join(missing)} not installed for {sys.executable}. On a machine with internet, "
            "scripts/gpu_check_wheels.sh downloads the wheels the services need; install them here with "
            "`python3 -m pip install --no-index --no-deps --target /tmp/site .lab/wheels/*.whl` and run with "
            "PYTHONPATH=/tmp/site (docs/gpu-check.md says more)."
        )
    # The file each service serves (servelab.stack.catalogue): fastapi_onnx the ONNX export, the others PyTorch's.
    needed = {paths.ARTIFACTS_DIR / ("food11.onnx" if name == "fastapi_onnx" else "food11.pth") for name in services}
    absent = sorted(str(path) for path in needed if not path.is_file())
    if absent:
        return (
            f"Missing: {', '.join(absent)}. Run `make artifacts` (on a machine with the lab's virtualenv), and "
            "bring the model files along (docs/gpu-check.md lists them)."
        )
    return None


def check(args: argparse.Namespace) -> int:
    device = args.device
    if (lacking := cannot_run(args.services)) is not None:
        print(lacking, file=sys.stderr)
        return EXIT_CANNOT_RUN
    sightings = look_for_gpus() if device == "cuda" else []
    if sightings and (message := no_gpu_message(sightings)) is not None:
        print(message, file=sys.stderr)
        return EXIT_CANNOT_RUN

    import onnxruntime

    providers = onnxruntime.get_available_providers()
    machine = machine_line(nvidia_smi_gpus(), providers) + "".join(f"; {sighting}" for sighting in sightings)
    log.info("%s", machine)
    onnx_without_gpu = onnx_runtime_without_gpu(providers, onnxruntime.__version__) if device == "cuda" else None
    # Every process started from here on (the services, the ceilings, the load) imports servelab from this
    # working tree, also where it is not installed, and asks for the device checked (a ceiling may be told another).
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(paths.REPO_ROOT), os.environ.get("PYTHONPATH")]))
    os.environ["INFERENCE_DEVICE"] = device

    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    log_dir = paths.LOG_DIR / f"gpu-check-{stamp}"
    runtimes = sorted({CEILING_RUNTIME[name] for name in args.services})
    # A bar over the check's steps where someone watches, the ETA from the steps done so far (the
    # log's lines go above it): each service's load points, then each runtime's ceiling.
    total = len(args.services) * len(args.concurrency) + len(runtimes)
    with progress.bar("GPU check", total, "step", smoothing=0) as steps, logging_redirect_tqdm():
        checked = check_services(args, onnx_without_gpu, log_dir, steps)
        ceilings = {}
        for runtime in runtimes:
            if runtime == "onnxruntime" and onnx_without_gpu is not None:
                # fastapi_onnx runs on the CPU, so its ceiling is taken there: this machine's cores.
                ceilings[runtime] = measure_ceiling(runtime, "cpu", args.seconds, args.warmup)
                ceilings[runtime].note = ceilings[runtime].note or f"on the CPU: {onnx_without_gpu}"
            else:
                ceilings[runtime] = measure_ceiling(runtime, device, args.seconds, args.warmup)
            steps.update()

    text = report(machine, args, checked, ceilings)
    print("\n" + text)
    out = args.out or paths.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu-check-{stamp}.md").write_text(text + "\n## Every run\n\n" + every_run_table(checked, ceilings))
    save_results(
        [run for service in checked for run in service.runs] + [run for c in ceilings.values() for run in c.runs],
        out / f"gpu-check-{stamp}.json",
        metadata={
            "machine": machine,
            "device": device,
            "seconds": args.seconds,
            "warmup_s": args.warmup,
            "services": {
                service.name: {
                    "device": service.device,
                    "verdict": service.verdict.status,
                    "reason": service.verdict.reason,
                    "health": service.health,
                    "gpu_memory_mib": service.gpu_memory_mib,
                    "gpu_busy_percent": service.gpu_busy_percent,
                }
                for service in checked
            },
            "ceilings": {runtime: ceiling.note for runtime, ceiling in ceilings.items()},
        },
    )
    print(f"Written: {out / f'gpu-check-{stamp}.md'} and .json; the services' logs in {log_dir}", file=sys.stderr)
    return EXIT_FAILED if any(service.verdict.status == FAIL for service in checked) else 0


def measure_ceiling(runtime: str, device: str, seconds: float, warmup_s: float) -> Ceiling:
    """`runtime`'s in-process ceiling on `device` (servelab.measure.ceilings): the sweep of one request
    in flight, then the pipelined one; or why it was not measured."""
    ceiling = Ceiling(runtime)
    try:
        for pipelined in (False, True):
            swept = sweep(runtime, pipelined, seconds, warmup_s, device=device)
            swept.close()
            ceiling.runs += swept.points
            if pipelined:
                ceiling.one_process, ceiling.pipelined = swept.best_alone, swept.best
            else:
                ceiling.one_in_flight = swept.best
    except RuntimeError as exc:
        log.error("in-process ceiling, %s on %s: %s", runtime, device, exc)
        ceiling.one_in_flight = ceiling.one_process = ceiling.pipelined = None
        ceiling.note = f"not measured: {last_line(str(exc))}"
    return ceiling


def check_services(args: argparse.Namespace, onnx_without_gpu: str | None, log_dir: Path, steps: Any) -> list[Checked]:
    """Start every service at once, wait until all have started, judge and load each in turn (a
    step of `steps` a load point; those of a service that does not run leave the total), read
    their GPU memory while all are up, and stop them all (also on Ctrl-C or a failure). No load is
    sent while a service still starts: a start loads a model and runs a first inference, which
    would take the cores from the service measured."""
    device, image, free = args.device, paths.SAMPLE_IMAGE.read_bytes(), iter(astuple(Ports.found_free()))
    checked = []
    with contextlib.ExitStack() as cleanup:
        work_dir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="gpu-check-")))
        to_start: list[tuple[ServiceSpec, HttpTarget]] = []
        for name in args.services:
            if name == "triton":
                continue
            port, env = next(free), {"INFERENCE_DEVICE": device}
            spec = (
                fastapi_service(name.split("_")[1], port, env)
                if "fastapi" in name
                else naive_service("pytorch", port, env)
            )
            spec.ready_timeout_s = READY_TIMEOUT_S
            to_start.append((spec, FastAPITarget(f"http://127.0.0.1:{port}", image, name=SHOWN.get(name, name))))
        if "triton" in args.services:
            binary, found_in = find_tritonserver(args.tritonserver)
            triton_ports = [next(free) for _ in range(3)]
            triton = (
                triton_service(binary, found_in, device, image, triton_ports, work_dir, args.triton_model_path)
                if binary
                else found_in
            )
            if isinstance(triton, str):
                checked.append(Checked("triton", Verdict(NOT_RUN, triton)))
                steps.total -= len(args.concurrency)
            else:
                to_start.append(triton)
        started = []
        for spec, request in to_start:
            started.append(Started(ManagedProcess(spec, log_dir), request))
            cleanup.callback(started[-1].process.stop)
            started[-1].process.start()
        for service in started:
            try:
                service.process.wait_ready()
            except StackError as exc:  # its log's last lines are in the log; the table says where the log is
                log.error("%s", exc)
                service.not_ready = f"{str(exc).splitlines()[0]} (its log: {service.process.log_path})"
        measured = [checked_service(service, args, onnx_without_gpu, steps) for service in started]
        memory = gpu_memory_by_pid() if device == "cuda" else "a CPU run"
        log.info("GPU memory (MiB) by process: %s", memory)
        for result, service in zip(measured, started, strict=True):
            pids = service.process.pids()
            held = [memory[pid] for pid in pids if pid in memory] if isinstance(memory, dict) else []
            result.gpu_memory_mib = sum(held) if held else None
    return sorted(checked + measured, key=lambda service: SERVICES.index(service.name))


SHOWN = {"naive_pt": "naive/pytorch", "triton": f"triton/{TRITON_MODEL} (http)"}


def checked_service(service: Started, args: argparse.Namespace, onnx_without_gpu: str | None, steps: Any) -> Checked:
    """Judge where the service runs, then load it at each concurrency (a step of `steps` each)."""
    device, seconds, warmup_s, concurrencies = args.device, args.seconds, args.warmup, args.concurrency
    if service.not_ready is not None:
        steps.update(len(concurrencies))
        return Checked(service.name, Verdict(FAIL, f"did not start: {service.not_ready}"))
    if service.name == "triton":
        log_text = service.process.log_path.read_text(errors="replace")
        checked = Checked(service.name, judge_triton(log_text, device))
        checked.device = ", ".join(sorted({match["device"] for match in triton_instances(log_text)})) or "unknown"
    else:
        try:  # with requests, as the harness asks its servers (the load's client is built for speed)
            health = requests.get(service.process.spec.ready_url, timeout=10).json()
            if not isinstance(health, dict):
                raise ValueError(f"{service.process.spec.ready_url} answered {health!r}, not an object")
        except (requests.RequestException, ValueError) as exc:
            return Checked(service.name, Verdict(FAIL, f"its /health could not be read: {exc}"))
        if service.name == "naive_pt":
            checked = Checked(service.name, Verdict(REFERENCE, "the original lab's kind of app, never judged"))
        else:
            runtime_without_gpu = onnx_without_gpu if service.name == "fastapi_onnx" else None
            checked = Checked(service.name, judge_service(health, device, runtime_without_gpu), health=health)
        checked.device = str(health.get("device", "unknown"))
    log.info("%s: %s", service.name, checked.verdict)
    request, pids = service.request, service.process.pids()
    port = urllib.parse.urlsplit(request.url).port or 80
    for concurrency in concurrencies:
        log.info("%s at c=%d: %g s warm-up, %g s measured", service.name, concurrency, warmup_s, seconds)
        with ResourceSampler(pids=pids) as sampler:
            try:
                run = load_point(
                    request.url,
                    request.body,
                    request.headers,
                    request.name,
                    concurrency,
                    seconds,
                    warmup_s,
                    pids,
                    port,
                    available_cores(),
                )
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                checked.verdict = Verdict(FAIL, f"its load at c={concurrency} failed: {exc}")
                return checked
        run.resources = series = sampler.series()
        checked.runs.append(run)
        steps.update()
        if run.requests and not run.latencies_ms:  # nothing answered: more load would only wait on time-outs
            log.error(
                "%s answered none of its %d requests at c=%d: its other points are not run; its log: %s",
                service.name,
                run.requests,
                concurrency,
                service.process.log_path,
            )
            steps.update(len(concurrencies) - len(checked.runs))
            break
        log.info(
            "%s at c=%d: %.1f req/s, %d errors; %s",
            service.name,
            concurrency,
            run.throughput_rps,
            run.error_count,
            run.notes[-1],
        )
    if device == "cuda":
        busy = [gpu["util_percent_mean"] for gpu in summarize(series)["gpus"]]
        checked.gpu_busy_percent = max(busy) if busy else None
    checked.verdict = judge_load(checked.verdict, checked.runs)
    return checked


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """The options the GPU check shares with notebook 6's claims (servelab.bench.gpu_check.notebook6)."""
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same steps on the CPU")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before each")
    parser.add_argument("--tritonserver", type=Path, help="the tritonserver to run (default: the wheel's, or PATH's)")
    parser.add_argument(
        "--triton-model-path",
        nargs="*",
        default=[],
        metavar="DIR",
        help="folders Triton's model.py puts first on its path (numpy 1.x for the nvidia-pytriton wheel's backend)",
    )
    parser.add_argument("--out", type=Path, help="where the table goes (default: results/)")


def run_stoppable(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """`run(args)`, logging to stderr, with SIGTERM and Ctrl-C ending it through its clean-up."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return run(args)
    except KeyboardInterrupt:  # the clean-up has run: every process started is stopped
        print("Interrupted: every process the check started is stopped.", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    description = (gpu_check.__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m servelab.bench.gpu_check", description=description)
    add_common_options(parser)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each load point and plan")
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCIES), help="closed-loop users")
    parser.add_argument("--services", nargs="+", choices=SERVICES, default=list(SERVICES))
    return run_stoppable(check, parser.parse_args(argv))
