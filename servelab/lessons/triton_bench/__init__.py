"""Notebooks 6 and 7, benchmarking Triton: notebooks/6_triton_bench.py (queueing and instances of
the Python-backend model) and notebooks/7_triton_batching.py (the ONNX Runtime backend, bursty
arrivals and dynamic batching). `checks_queueing` judges the queue (notebook 6, section 1; Poisson
arrivals, notebook 7, section 3), `checks_capacity` batches from one client and instances (notebook
6; ONNX against Python, notebook 7, section 1), `checks_batching` dynamic batching (notebook 7,
section 4), all on Triton's own statistics; `views` shows what the device did, the batches that ran
and the queue against M/D/1 and M/G/1. Notebook 6's claims measured on a GPU machine with these
checks are servelab.bench.gpu_check.notebook6's (`make test-gpu-notebook6`).
"""

from servelab.lessons.triton_bench.checks_batching import (
    batch_cost,
    batching_keeps_latency_flat,
    batching_shortens_the_queue,
)
from servelab.lessons.triton_bench.checks_capacity import (
    MARGIN,
    client_batching,
    instance_scaling,
    instances_cpu,
    instances_stop_helping,
    onnx_beats_python,
)
from servelab.lessons.triton_bench.checks_queueing import (
    in_server,
    poisson_queues_more,
    queue_is_the_clients_ahead,
    queueing_grows,
)
from servelab.lessons.triton_bench.views import (
    Capacity,
    batches_ran,
    device_use,
    queueing_view,
    show_batches,
    show_queueing,
)

__all__ = [
    "MARGIN",
    "Capacity",
    "batch_cost",
    "batches_ran",
    "batching_keeps_latency_flat",
    "batching_shortens_the_queue",
    "client_batching",
    "device_use",
    "in_server",
    "instance_scaling",
    "instances_cpu",
    "instances_stop_helping",
    "onnx_beats_python",
    "poisson_queues_more",
    "queue_is_the_clients_ahead",
    "queueing_grows",
    "queueing_view",
    "show_batches",
    "show_queueing",
]
