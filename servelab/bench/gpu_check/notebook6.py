"""Notebook 6's claims measured where the lab is taught, on a GPU: `make test-gpu-notebook6` (113 s on 2 CPU cores).

    python -m servelab.bench.gpu_check.notebook6 [--device cuda|cpu] [--seconds 8] [--warmup 2]
                                                       [--instances 1 2 4] [--tritonserver PATH]
                                                       [--triton-model-path DIR...] [--out DIR]

Notebook 6 judges two claims on the machine it runs on, and students meet them on the P100 node,
where neither CI nor this project's machines go: a request of 16 images costs the model little
more than one of 1 (its forward pass, which model.py times apart from decoding), and more instances
of the Python-backend model help while the device has idle capacity, then stop helping. This
measures both with what a bare GPU machine has (no perf_analyzer, no Jupyter), and judges them
with the notebook's own checks (checks_capacity, beside it) on figures of the same kinds:

1. Triton's food_classifier (the nvidia-pytriton wheel's server, staged as the GPU check stages it)
   with one instance on GPU 0: one client sending 1 image per request, then 16 (`client_batching`);
   then 8 clients, the notebook's load for its instances.
2. Triton started again with each other count of `--instances` on GPU 0 (the `instance_group`
   typed as the notebook has a student type it; one GPU here, so the node's counts per GPU),
   8 clients each (`instances_stop_helping`, which takes three counts).
Each run: a warm-up, then a window of the GPU check's closed loop (servelab.loadgen.processes);
Triton's statistics (queue, compute infer) and model.py's stage times (decode, forward pass) are
read over the window, and the GPU's busy share and each instance's CPU sampled during it.
3. One table of the runs, then each claim's verdict, printed and written to
   results/notebook6-<time>.md and .json.

`--device cpu` runs the same on the CPU (KIND_CPU instances). Exit code 0 whatever the claims' verdicts
(a claim that does not hold is a finding); 1: Triton did not serve as asked (it did not start, an
instance ran elsewhere or was missing, a request failed); 2: it cannot run here.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import requests

from servelab import paths
from servelab.bench.gpu_check.check import add_common_options, run_stoppable
from servelab.bench.gpu_check.machine import look_for_gpus, machine_line, no_gpu_message, nvidia_smi_gpus
from servelab.bench.gpu_check.triton_alone import TRITON_MODEL, find_tritonserver, triton_service
from servelab.bench.gpu_check.verdicts import FAIL, judge_triton, triton_instances
from servelab.lessons.expectations import Expectation, machine_hardware
from servelab.lessons.triton_bench.checks_capacity import client_batching, instances_cpu, instances_stop_helping
from servelab.loadgen.processes import load_point
from servelab.loadgen.targets import TritonHttpTarget
from servelab.measure.processes import ProcessCpu, triton_instance_processes
from servelab.measure.resources import ResourceSampler, summarize
from servelab.report.tables import markdown_table
from servelab.results import RunResult, save_results
from servelab.service.cores import available_cores
from servelab.stack.ports import Ports
from servelab.stack.supervision import ManagedProcess, StackError
from servelab.triton import stats

log = logging.getLogger(__name__)

EXIT_FAILED, EXIT_CANNOT_RUN = 1, 2
CLIENTS = 8  # notebook 6 loads each instance count with 8 clients
BATCH = 16  # and its one client sends 16 images per request
INSTANCES = (1, 2, 4)


class NotServed(RuntimeError):
    """Triton did not serve as asked: it did not start, or its instances are not those asked for."""


class CannotRun(RuntimeError):
    """Triton cannot run here (no server, no Triton tooling, numpy 2 without a folder of numpy 1.x)."""


def instance_group(count: int) -> str:
    """`count` instances on GPU 0, typed as notebook 6 has a student type a group (on the CPU, the
    lab's staging keeps the count and runs them as KIND_CPU)."""
    return f"instance_group [ {{ count: {count}, kind: KIND_GPU, gpus: [ 0 ] }} ]"


@dataclass
class Triton:
    """Triton serving food_classifier with some instances: its process and where it answers."""

    running: ManagedProcess
    ports: Sequence[int]  # HTTP, gRPC, metrics
    repository: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ports[0]}"

    def stage_times(self) -> dict[tuple[str, str], float]:
        answer = requests.get(f"http://127.0.0.1:{self.ports[2]}/metrics", timeout=10)
        return stats.stage_times_us(answer.text, TRITON_MODEL)


@contextlib.contextmanager
def serving(args: argparse.Namespace, count: int, work_dir: Path, log_dir: Path) -> Iterator[Triton]:
    """Triton with `count` instances, ready and checked to run them where asked; stopped after."""
    binary, found_in = find_tritonserver(args.tritonserver)
    if binary is None:
        raise CannotRun(found_in)
    ports, image = astuple(Ports.found_free())[:3], paths.SAMPLE_IMAGE.read_bytes()
    staged = work_dir / f"{count}-instances"
    service = triton_service(
        binary, found_in, args.device, image, ports, staged, args.triton_model_path, instance_group(count)
    )
    if isinstance(service, str):
        raise CannotRun(service)
    running = ManagedProcess(service[0], log_dir / f"{count}-instances")
    try:
        running.start()
        try:
            running.wait_ready()
        except StackError as exc:
            raise NotServed(f"Triton with {count} instance(s) did not start: {exc}") from exc
        log_text = running.log_path.read_text(errors="replace")
        if (verdict := judge_triton(log_text, args.device)).status == FAIL:
            raise NotServed(f"Triton with {count} instance(s): {verdict.reason}")
        if (served := len(triton_instances(log_text))) != count:
            raise NotServed(f"asked for {count} instance(s), Triton's log shows {served} (its log: {running.log_path})")
        yield Triton(running, ports, staged / "models")
    finally:
        running.stop()


def one_run(triton: Triton, name: str, concurrency: int, batch_size: int, args: argparse.Namespace) -> RunResult:
    """One run: a warm-up (its requests in no figure), then a window with Triton's statistics and
    model.py's stage times read over it, and the GPU and each instance's CPU sampled during it."""
    image = paths.SAMPLE_IMAGE.read_bytes()
    request = TritonHttpTarget(triton.address, TRITON_MODEL, image, batch_size=batch_size)
    pids, port, cores = triton.running.pids(), triton.ports[0], available_cores()

    def load(seconds: float) -> RunResult:
        return load_point(
            request.url, request.body, request.headers, name, concurrency, seconds, 0.0, pids, port, cores
        )

    log.info("%s: %g s warm-up, %g s measured", name, args.warmup, args.seconds)
    if args.warmup > 0:
        load(args.warmup)
    instances = triton_instance_processes(triton.repository, TRITON_MODEL)
    before, stages_before = stats.fetch_settled(triton.address, TRITON_MODEL), triton.stage_times()
    with ResourceSampler(pids=instances.values()) as sampler, ProcessCpu(instances) as per_instance:
        run = load(args.seconds)
    run.resources = {**sampler.series(), "processes": per_instance.percent}
    delta = stats.diff(before, stats.fetch_settled(triton.address, TRITON_MODEL))
    stages = stats.stage_mean_ms(stages_before, triton.stage_times(), delta.execution_count)
    run.triton_stats = {**delta.to_dict(), "stage_mean_ms": stages}
    run.batch_size = batch_size
    log.info("%s: %.1f req/s, %d errors; %s", name, run.throughput_rps, run.error_count, run.notes[-1])
    return run


@dataclass
class ClaimRuns:
    """Every run, by what it shows: one client with 1 and with BATCH images per request, and CLIENTS
    clients by instance count."""

    single: RunResult | None = None
    batched: RunResult | None = None
    by_instances: dict[int, RunResult] = field(default_factory=dict)

    def runs(self) -> list[RunResult]:
        return [run for run in (self.single, self.batched, *self.by_instances.values()) if run is not None]


def run_all(args: argparse.Namespace, log_dir: Path) -> ClaimRuns:
    """Every run of both claims, Triton started once for each instance count (its logs in `log_dir`)."""
    found = ClaimRuns()
    with tempfile.TemporaryDirectory(prefix="notebook6-") as folder:
        for count in sorted(args.instances):  # 1 first: the batch runs use one instance
            with serving(args, count, Path(folder), log_dir) as triton:
                if count == 1:
                    found.single = one_run(triton, "1 instance, 1 client, 1 image a request", 1, 1, args)
                    found.batched = one_run(triton, f"1 instance, 1 client, {BATCH} images a request", 1, BATCH, args)
                label = f"{count} instance{'s' * (count > 1)}, {CLIENTS} clients"
                found.by_instances[count] = one_run(triton, label, CLIENTS, 1, args)
    return found


def _ms(value: float | None, per_ms: float = 1.0) -> str:
    return "-" if value is None or value != value else f"{value / per_ms:.1f}"


def runs_table(runs: Sequence[RunResult]) -> str:
    headings = [
        "run",
        "req/s",
        "images/s",
        "p50 (ms)",
        "queue (ms)",
        "compute infer (ms)",
        "decode (ms)",
        "forward pass (ms)",
        "GPU busy (%)",
        "instances' CPU (% of a core)",
        "client CPU (% of a core)",
        "errors",
    ]
    rows = []
    for run in runs:
        triton = run.triton_stats or {}
        stages = triton.get("stage_mean_ms") or {}
        gpus = summarize(run.resources)["gpus"] if run.resources else []
        busy = ", ".join(f"{gpu['util_percent_mean']:.0f}" for gpu in gpus) or "-"
        cpu = instances_cpu(run)
        client = ", ".join(f"{share:.0f}" for share in (run.client or {}).get("cpu_percent", []))
        rows.append(
            [
                run.name,
                f"{run.throughput_rps:.1f}",
                f"{run.images_per_s:.1f}",
                f"{run.latency.p50_ms:.1f}",
                _ms(triton.get("avg_queue_us"), per_ms=1000),
                _ms(triton.get("avg_compute_infer_us"), per_ms=1000),
                _ms(stages.get("decode")),
                _ms(stages.get("forward")),
                busy,
                "-" if cpu != cpu else f"{cpu:.0f}",
                client or "-",
                str(run.error_count),
            ]
        )
    return markdown_table(headings, rows)


def claims(found: ClaimRuns, hardware: str, cores: int) -> list[Expectation]:
    judged = [client_batching(found.single, found.batched, hardware=hardware, cores=cores)]
    if len(found.by_instances) == 3:
        judged.append(instances_stop_helping(dict(found.by_instances), hardware=hardware, cores=cores))
    return judged


def said(expectation: Expectation) -> str:
    """A claim's verdict with its reason, which holds the figures beside the conditions' (decode
    time, the instances' CPU), also where the claim held: what a reader of the table needs."""
    text = str(expectation)
    return text + ("" if "  Why: " in text else f"\n  Why it may or may not hold: {expectation.reason}") + "\n"


def report(machine: str, args: argparse.Namespace, found: ClaimRuns, judged: Sequence[Expectation]) -> str:
    mode = "On the GPU." if args.device == "cuda" else "**CPU mode (--device cpu): nothing ran on a GPU.**"
    return "\n".join(
        [
            "# Notebook 6's claims on this machine",
            "",
            machine,
            "",
            f"{mode} Triton's {TRITON_MODEL} (Python backend), loaded by the GPU check's closed loop "
            f"({args.seconds:g} s a run after a {args.warmup:g} s warm-up); queue and compute infer: Triton's "
            "statistics per request; decode and forward pass: model.py's own clock per execution (Triton's "
            "/metrics); GPU busy: the sampler's mean over the window.",
            "",
            runs_table(found.runs()),
            "The claims, judged by notebook 6's own checks (servelab.lessons.triton_bench):",
            "",
            *(said(expectation) for expectation in judged),
        ]
    )


def check(args: argparse.Namespace) -> int:
    sightings = look_for_gpus() if args.device == "cuda" else []
    if sightings and (message := no_gpu_message(sightings)) is not None:
        print(message, file=sys.stderr)
        return EXIT_CANNOT_RUN
    cores = available_cores()
    hardware = machine_hardware() if args.device == "cuda" else f"{cores} CPU core(s) (--device cpu)"
    import onnxruntime  # for the machine's line alone, as the GPU check writes it

    machine = machine_line(nvidia_smi_gpus(), onnxruntime.get_available_providers())
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    log_dir = paths.LOG_DIR / f"notebook6-{stamp}"
    try:
        found = run_all(args, log_dir)
    except CannotRun as exc:
        print(f"Triton cannot run here: {exc}", file=sys.stderr)
        return EXIT_CANNOT_RUN
    except NotServed as exc:
        print(f"Triton did not serve as asked: {exc}", file=sys.stderr)
        return EXIT_FAILED
    judged = claims(found, hardware, cores)
    text = report(machine, args, found, judged)
    print("\n" + text)
    out = args.out or paths.RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    (out / f"notebook6-{stamp}.md").write_text(text)
    verdicts = {expectation.claim: expectation.outcome.value for expectation in judged}  # the table's, for a script
    save_results(
        found.runs(),
        out / f"notebook6-{stamp}.json",
        metadata={"machine": machine, "hardware": hardware, "device": args.device, "verdicts": verdicts},
    )
    print(f"Written: {out / f'notebook6-{stamp}.md'} and .json; Triton's logs in {log_dir}", file=sys.stderr)
    return EXIT_FAILED if any(run.error_count for run in found.runs()) else 0


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m servelab.bench.gpu_check.notebook6", description=description)
    add_common_options(parser)
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each run")
    parser.add_argument("--instances", nargs=3, type=int, default=list(INSTANCES), help="three instance counts")
    args = parser.parse_args(argv)
    if 1 not in args.instances or len(set(args.instances)) != 3:
        parser.error("--instances: three different counts, one of them 1 (the batch runs use one instance)")
    return run_stoppable(check, args)


if __name__ == "__main__":
    sys.exit(main())
