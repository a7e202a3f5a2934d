"""Notebooks 6 and 7, benchmarking Triton: notebooks/6_triton_bench.py (queueing and instances of
the Python-backend model) and notebooks/7_triton_batching.py (the ONNX Runtime backend, bursty
arrivals and dynamic batching).

- `checks_queueing`: the queue as clients are added (notebook 6, section 1: `queueing_grows`,
  `queue_is_the_clients_ahead`), and Poisson against constant arrivals (notebook 7, section 3:
  `poisson_queues_more`);
- `checks_capacity`: a batch from one client and more instances (notebook 6, sections 1 and 2:
  `client_batching`, `instances_stop_helping`), ONNX Runtime against the Python backend and more
  ONNX instances (notebook 7, section 1: `onnx_beats_python`, `instance_scaling`), and `MARGIN`,
  the noise between two runs that every check allows;
- `checks_batching`: dynamic batching (notebook 7, section 4: `batching_shortens_the_queue`,
  `batching_keeps_latency_flat`, `batch_cost`);
- `views`: what the device did during each run (`device_use`, notebook 6), the batches that ran
  (`batches_ran`, drawn by `show_batches`), and the queueing view against M/D/1 and M/G/1
  (`queueing_view`, drawn by `show_queueing`; notebook 7). Notebook 6's claims measured on a GPU
  machine with these checks are servelab.bench.gpu_check.notebook6's (`make test-gpu-notebook6`).

Every check is a function of the runs, judged on Triton's own statistics; the machine it names in
its reason is read where it runs unless given. The notebooks call them by this folder's name
(`triton_bench.queueing_grows`).
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
