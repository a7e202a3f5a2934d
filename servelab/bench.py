"""The headline benchmark: every way the lab serves the model, measured in one run on this machine.

    python -m servelab bench [--profile full|quick] [--out DIR]     (make bench / make bench-quick)

1. The in-process limit (servelab.inprocess) for PyTorch and ONNX Runtime: the ceiling.
2. FastAPI PyTorch, FastAPI ONNX, Triton `food_classifier` (Python backend) and Triton
   `food_classifier_onnx`, each at concurrency 1, 8 and 16, with the lab's load generator
   (closed loop), sampling CPU/GPU during each run and reading Triton's statistics around it.
3. A check that the load generator is not the bottleneck: at concurrency 8 against
   `food_classifier_onnx`, its throughput and p50 beside perf_analyzer's, measured in this run.

Writes results.json, report.md and PNG plots to a new folder under results/ (git-ignored).
Speed is never asserted here: this reports what the machine did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import platform
import statistics
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import requests

from servelab import artifacts, inprocess, loadgen, paths, perf_analyzer, plots, triton_stats
from servelab.environment import machine_info
from servelab.models import ModelRepository
from servelab.profiles import PROFILES, Profile
from servelab.resources import ResourceSampler
from servelab.results import RunResult, save_results
from servelab.stack import LocalStack, Ports, fastapi_service, triton_service

log = logging.getLogger(__name__)

RESULTS_DIR = paths.REPO_ROOT / "results"
AGREEMENT_MODEL = "food_classifier_onnx"
AGREEMENT_CONCURRENCY = 8
AGREEMENT_LIMITS = {"throughput": 0.10, "p50": 0.15}


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


@dataclass(frozen=True)
class ServedTarget:
    name: str
    kind: str  # loadgen target kind
    model: str | None
    runtime: str  # which in-process limit it is compared with

    def address(self, endpoints: Endpoints) -> str:
        return {"fastapi_pt": endpoints.fastapi_pt, "fastapi_onnx": endpoints.fastapi_onnx}.get(
            self.name, endpoints.triton_http
        )


TARGETS = (
    ServedTarget("fastapi_pt", "fastapi", None, "pytorch"),
    ServedTarget("fastapi_onnx", "fastapi", None, "onnxruntime"),
    ServedTarget("triton/food_classifier", "triton-http", "food_classifier", "pytorch"),
    # Its clients send tensors they preprocessed themselves (here: once), so it is compared with
    # inference alone.
    ServedTarget("triton/food_classifier_onnx", "triton-http", "food_classifier_onnx", "onnxruntime-inference-only"),
)
# (runtime, decode per request?) for each in-process limit
BASELINES = {
    "pytorch": ("pytorch", True),
    "onnxruntime": ("onnxruntime", True),
    "onnxruntime-inference-only": ("onnxruntime", False),
}


def runtime_versions(endpoints: Endpoints) -> dict:
    versions = {"python": platform.python_version()}
    for package in (
        "torch",
        "torchvision",
        "onnxruntime",
        "numpy",
        "fastapi",
        "uvicorn",
        "tritonclient",
        "nvidia-pytriton",
    ):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    with contextlib.suppress(requests.RequestException, ValueError):
        server = requests.get(f"http://{endpoints.triton_http}/v2", timeout=5).json()
        versions["tritonserver"] = server.get("version", "unknown")
    return versions


def _measure(target: ServedTarget, endpoints: Endpoints, concurrency: int, profile: Profile, image: bytes) -> RunResult:
    stats = triton_stats.measure(endpoints.triton_http, target.model) if target.model else contextlib.nullcontext()
    with ResourceSampler() as sampler, stats as stats_window:
        result = loadgen.closed_loop(
            target.kind,
            target.address(endpoints),
            model=target.model,
            image_bytes=image,
            concurrency=concurrency,
            duration_s=profile.duration_s,
            warmup_s=profile.warmup_s,
        )
    result.target = target.name
    result.resources = sampler.series()
    if target.model:
        result.triton_stats = stats_window.delta.to_dict()
    return result


def _agreement(endpoints: Endpoints, profile: Profile, image: bytes) -> dict:
    """The load generator and perf_analyzer, alternately, against the same model at the same load.

    Single runs on a busy 2-core machine differ by more than the tolerances, whoever measures,
    so the tools take turns `profile.agreement_pairs` times and their medians are compared.
    """
    target = next(t for t in TARGETS if t.model == AGREEMENT_MODEL)
    generator, reference = [], []
    for _ in range(profile.agreement_pairs):
        generator.append(
            loadgen.closed_loop(
                target.kind,
                target.address(endpoints),
                model=target.model,
                image_bytes=image,
                concurrency=AGREEMENT_CONCURRENCY,
                duration_s=profile.duration_s / 2,
                warmup_s=profile.warmup_s,
                progress=False,
            )
        )
        reference.append(
            perf_analyzer.run(
                endpoints.triton_http,
                AGREEMENT_MODEL,
                concurrency=AGREEMENT_CONCURRENCY,
                measurement_interval_ms=int(profile.duration_s * 1000 / 4),
                stability_percentage=25,
                **ModelRepository().get(AGREEMENT_MODEL).perf_analyzer_input(image, paths.LAB_DIR),
            ).results[0]
        )
    median = statistics.median
    ours = {
        "throughput_rps": median(r.throughput_rps for r in generator),
        "p50_ms": median(r.latency.p50_ms for r in generator),
    }
    theirs = {
        "throughput_rps": median(r.throughput_rps for r in reference),
        "p50_ms": median(r.latency.p50_ms for r in reference),
    }
    throughput_gap = abs(ours["throughput_rps"] / theirs["throughput_rps"] - 1)
    p50_gap = abs(ours["p50_ms"] / theirs["p50_ms"] - 1)
    return {
        "model": AGREEMENT_MODEL,
        "concurrency": AGREEMENT_CONCURRENCY,
        "pairs": profile.agreement_pairs,
        "loadgen": ours,
        "perf_analyzer": theirs,
        "throughput_gap": throughput_gap,
        "p50_gap": p50_gap,
        "within_limits": throughput_gap <= AGREEMENT_LIMITS["throughput"] and p50_gap <= AGREEMENT_LIMITS["p50"],
        "runs": {"loadgen": [r.to_dict() for r in generator], "perf_analyzer": [r.to_dict() for r in reference]},
    }


def run_benchmark(profile_name: str = "full", out_dir: Path | None = None, endpoints: Endpoints | None = None) -> Path:
    """Run the whole benchmark and write its report; returns the report folder.

    With `endpoints`, the services already running there are measured; without, the local
    stack is started on free ports for the run and stopped after it.
    """
    profile = PROFILES[profile_name]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = out_dir or RESULTS_DIR / f"bench-{stamp}-{profile_name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    built = artifacts.ensure_artifacts()
    image = paths.SAMPLE_IMAGE.read_bytes()

    with contextlib.ExitStack() as cleanup:
        if endpoints is None:
            ports = Ports.free()
            stack = LocalStack(
                [
                    fastapi_service("pt", ports.fastapi_pt),
                    fastapi_service("onnx", ports.fastapi_onnx),
                    # Staged models go to a scratch folder: the report folder keeps results only.
                    triton_service(ports.triton, work_dir=Path(cleanup.enter_context(tempfile.TemporaryDirectory()))),
                ],
                log_dir=out_dir / "logs",
            )
            cleanup.enter_context(stack)
            endpoints = Endpoints.of(ports)

        results: list[RunResult] = []
        baselines: dict[str, float] = {}
        for name, (runtime, decode) in BASELINES.items():
            log.info("in-process limit, %s", name)
            with ResourceSampler() as sampler:
                baseline = inprocess.run_pipeline(runtime, image, profile.duration_s, profile.warmup_s, decode=decode)
            baseline.resources = sampler.series()
            baselines[name] = baseline.throughput_rps
            results.append(baseline)

        for target in TARGETS:
            for concurrency in profile.concurrencies:
                log.info("%s at concurrency %d", target.name, concurrency)
                results.append(_measure(target, endpoints, concurrency, profile, image))

        log.info("load generator vs perf_analyzer, %d alternating pairs", profile.agreement_pairs)
        agreement = _agreement(endpoints, profile, image)
        metadata_ = {
            "profile": profile_name,
            "profile_settings": {"duration_s": profile.duration_s, "warmup_s": profile.warmup_s},
            "machine": machine_info(),
            "versions": runtime_versions(endpoints),
            "weights": built.weights_info,
            "payload": {"image": paths.SAMPLE_IMAGE.name, "bytes": len(image)},
            "baselines_rps": baselines,
            "agreement": agreement,
        }
    save_results(results, out_dir / "results.json", metadata_)
    write_report(results, metadata_, {t.name: t.runtime for t in TARGETS}, out_dir)
    log.info("benchmark report: %s", out_dir / "report.md")
    return out_dir


def write_report(results: list[RunResult], meta: dict, runtime_of: dict[str, str], out_dir: Path) -> Path:
    served = [r for r in results if r.tool != "in-process"]
    plots.plot_latency_throughput_vs_concurrency(served, out_dir / "latency_throughput.png")
    busiest = max(r.concurrency for r in served)
    plots.plot_latency_cdf([r for r in served if r.concurrency == busiest], out_dir / "latency_cdf.png")
    triton_runs = [r for r in served if r.triton_stats]
    plots.plot_batch_sizes(
        {r.label: r.triton_stats for r in triton_runs if r.concurrency == busiest}, path=out_dir / "batch_sizes.png"
    )
    heaviest = max(served, key=lambda r: r.throughput_rps)
    plots.plot_resources(heaviest.resources, out_dir / "resources.png", title=f"Resources during {heaviest.label}")

    baseline_of = {r.target: meta["baselines_rps"][runtime_of[r.target]] for r in served}
    baseline_of.update({r.target: r.throughput_rps for r in results if r.tool == "in-process"})
    weights = meta["weights"]
    agreement = meta["agreement"]
    machine = meta["machine"]
    lines = [
        f"# Headline benchmark ({meta['profile']} profile)",
        "",
        f"- Machine: {machine['cpu']}, {machine['cores']} cores; GPU: {', '.join(machine['gpus'])}",
        f"- Weights: **{weights['weights']}**"
        + (
            ""
            if weights["weights"] == "trained"
            else " (serving cost is that of a trained model; the predicted labels are not meaningful)"
        ),
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in meta["versions"].items()),
        f"- Each load point: {meta['profile_settings']['warmup_s']:g} s warm-up, then "
        f"{meta['profile_settings']['duration_s']:g} s measured; closed loop (each sender sends its next "
        f"request when the last one is answered); payload {meta['payload']['image']} "
        f"({meta['payload']['bytes']} bytes).",
        "- 'vs in-process' is throughput as a fraction of the in-process limit of the same work: "
        "PyTorch with decoding for fastapi_pt and food_classifier, ONNX Runtime with decoding for "
        "fastapi_onnx, ONNX Runtime inference alone for food_classifier_onnx (its clients send "
        "preprocessed tensors).",
        "",
        plots.results_table(results, baseline_of),
        "",
        "## Is the load generator the bottleneck?",
        "",
        f"Against Triton `{agreement['model']}` at concurrency {agreement['concurrency']}, in this run, "
        f"the two tools took turns {agreement['pairs']} time(s); medians:",
        "",
        "| tool | throughput (req/s) | p50 (ms) |",
        "| --- | ---: | ---: |",
        f"| servelab.loadgen | {agreement['loadgen']['throughput_rps']:.1f} | {agreement['loadgen']['p50_ms']:.1f} |",
        f"| perf_analyzer | {agreement['perf_analyzer']['throughput_rps']:.1f} "
        f"| {agreement['perf_analyzer']['p50_ms']:.1f} |",
        "",
        f"Throughput differs by {agreement['throughput_gap']:.1%} (limit {AGREEMENT_LIMITS['throughput']:.0%}), "
        f"p50 by {agreement['p50_gap']:.1%} (limit {AGREEMENT_LIMITS['p50']:.0%}): "
        + (
            "**they agree**, so the generator is not what limits these numbers."
            if agreement["within_limits"]
            else "**they do not agree within the limits**; treat the generator's numbers for this machine with care."
        ),
        "",
        "## Plots",
        "",
        "![latency and throughput vs concurrency](latency_throughput.png)",
        "",
        f"![latency CDF at concurrency {busiest}](latency_cdf.png)",
        "",
        "![Triton executions per batch size](batch_sizes.png)",
        "",
        "![resource utilization](resources.png)",
        "",
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    (out_dir / "metadata.json").write_text(json.dumps(meta, indent=1, default=str))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full")
    parser.add_argument("--out", type=Path, help="report folder (default: results/bench-<time>-<profile>)")
    args = parser.parse_args(argv)
    out_dir = run_benchmark(args.profile, args.out)
    print((out_dir / "report.md").read_text(), file=sys.stderr)
    return 0
