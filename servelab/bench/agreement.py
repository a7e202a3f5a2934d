"""The benchmark's third part: the lab's load generator against perf_analyzer, alternately, at
concurrency AGREEMENT_CONCURRENCY against AGREEMENT_MODEL (`measure_agreement`), compared pair by
pair (`agreement_gaps`), with the CPU each tool spent per request Triton answered.
"""

from __future__ import annotations

import resource
import statistics
import time

from servelab import loadgen, paths
from servelab.bench.served import Endpoints
from servelab.profiles import Profile
from servelab.results import RunResult
from servelab.triton import perf_analyzer
from servelab.triton import stats as triton_stats
from servelab.triton.models import ModelRepository

AGREEMENT_MODEL = "food_classifier_onnx"
AGREEMENT_CONCURRENCY = 8


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


def measure_agreement(endpoints: Endpoints, profile: Profile, image: bytes) -> dict:
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
        )
        generator.append(result)
        generator_cpu.append(own_s / answered)
        result, answered, _, child_s = _counted(
            lambda: perf_analyzer.run(
                endpoints.triton_http,
                AGREEMENT_MODEL,
                concurrency=AGREEMENT_CONCURRENCY,
                measurement_interval_ms=int(profile.duration_s * 1000 / 4),
                stability_percentage=25,
                **ModelRepository().get(AGREEMENT_MODEL).perf_analyzer_input(image, paths.LAB_DIR),
            ).results[0],
            endpoints.triton_http,
        )
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
