"""A Triton statistics response, as Triton writes it, for the tests that read one without a server;
and the requests waiting in a real Triton's queue, which the tests of cancellation wait on."""

from __future__ import annotations

import re

import requests


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


def pending_requests(metrics_url: str, model: str) -> int:
    """How many requests of `model` wait in Triton's queue (its scheduler's or its sequence
    batcher's), not yet in an execution: the gauge nv_inference_pending_request_count of Triton's
    metrics at `metrics_url`. A test waits on it (tests.helpers.until), never on a sleep that a busy
    machine can outlast."""
    text = requests.get(metrics_url, timeout=5).text
    found = re.search(rf'^nv_inference_pending_request_count\{{model="{re.escape(model)}",[^}}]*\}} (\S+)$', text, re.M)
    assert found, f"{metrics_url} has no pending-request gauge for {model!r}: is the model loaded?"
    return int(float(found.group(1)))
