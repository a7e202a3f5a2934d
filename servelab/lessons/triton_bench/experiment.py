"""What notebook 7 runs beyond `lab.triton.perf`'s single runs: the Poisson sweep of its section 4."""

from __future__ import annotations

from collections.abc import Callable

from servelab.results import RunResult


def poisson_sweep(perf: Callable[..., RunResult | None], rates: list[float], model: str = "food_classifier_onnx"):
    """Poisson runs of `model` at every rate (`perf`: lab.triton.perf), each with Triton's statistics
    over that run, and a line of them printed: inferences, executions, the average batch."""
    sweep: dict[str, RunResult | None] = {}
    for rate in rates:
        result = perf(model, rate=rate, distribution="poisson", triton_stats=True)
        sweep[f"{rate:g} req/s"] = result
        if result is not None and (stats := result.triton_stats) is not None:
            print(
                f"    server: {stats['inference_count']} inferences in {stats['execution_count']} executions "
                f"(average batch {stats['avg_batch_size']:.2f})"
            )
    return sweep
