"""A Triton statistics response, as Triton writes it, for the tests that read one without a server."""

from __future__ import annotations


def duration(count: int, ns: int) -> dict:
    return {"count": count, "ns": ns}


def snapshot(inferences: int, executions: int, requests: int, ms_each: float, batches: dict[int, int]) -> dict:
    """A statistics response as Triton writes it, every stage taking `ms_each` per request."""
    ns = int(requests * ms_each * 1e6)
    inference_stats = {
        stage: duration(requests, ns)
        for stage in ("success", "queue", "compute_input", "compute_infer", "compute_output")
    }
    inference_stats["fail"] = duration(1, 5_000)
    return {
        "model_stats": [
            {
                "name": "m",
                "version": "1",
                "inference_count": inferences,
                "execution_count": executions,
                "inference_stats": inference_stats,
                "batch_stats": [
                    {
                        "batch_size": size,
                        **{
                            stage: duration(count, count * 1000)
                            for stage in ("compute_input", "compute_infer", "compute_output")
                        },
                    }
                    for size, count in batches.items()
                ],
            }
        ]
    }
