"""What the tests of the lessons' checks share: the outcomes an expectation came to, and synthetic
perf_analyzer runs against Triton (closed loop, or Poisson arrivals with Triton's account)."""

from servelab.lessons.expectations import Outcome
from tests.helpers import synthetic_run


def outcomes(expectation) -> list[Outcome]:
    return [part.outcome for part in expectation.conditions]


def perf_run(throughput_rps=30.0, mean_ms=30.0, queue_ms=0.0, compute_ms=25.0, batch_size=1, concurrency=1, **fields):
    """A perf_analyzer run whose server-side breakdown is `queue_ms` and `compute_ms` per request."""
    breakdown = {"server_queue_us": 1000 * queue_ms, "server_compute_infer_us": 1000 * compute_ms}
    fields.update(tool="perf_analyzer", batch_size=batch_size, server_breakdown=breakdown)
    return synthetic_run("triton/m", concurrency, throughput_rps, mean_ms, **fields)


def poisson(rate_rps, mean_ms, queue_ms, compute_ms, batches=None, per_image=None):
    """An open-loop run at `rate_rps` with Triton's executions by batch size (`batches`) and the
    compute per image of each (`per_image`)."""
    stats = {
        "executions_by_batch_size": batches or {1: 100},
        "compute_ms_per_inference": compute_ms,
        "compute_ms_per_inference_by_batch_size": per_image or {1: compute_ms},
    }
    open_loop = {"concurrency": None, "mode": "open", "rate_rps": rate_rps, "arrival": "poisson"}
    return perf_run(rate_rps, mean_ms, queue_ms, compute_ms, triton_stats=stats, **open_loop)
