"""Notebook 6 (notebooks/6_triton_bench.py): benchmarking Triton: queueing, instances, backends and
dynamic batching.

- `checks_queueing`: the queue as clients are added, and Poisson against constant arrivals
  (sections 1 and 5: `queueing_grows`, `queue_is_the_clients_ahead`, `poisson_queues_more`);
- `checks_capacity`: a batch from one client, more instances, ONNX Runtime against the Python
  backend (sections 1 to 3: `client_batching`, `instances_stop_helping`, `instance_scaling`,
  `onnx_beats_python`), and `MARGIN`, the noise between two runs that every check allows;
- `checks_batching`: dynamic batching (section 6: `batching_shortens_the_queue`,
  `batching_keeps_latency_flat`, `batch_cost`);
- `experiment`: the Poisson sweep (`poisson_sweep`), run through `lab.triton.perf`;
- `views`: what the device did during each run (`device_use`), the batches that ran
  (`batches_ran`), and the queueing view against M/D/1 and M/G/1 (`queueing_view`).

Every check is a function of the runs, judged on Triton's own statistics. The notebook calls them
by this folder's name (`triton_bench.queueing_grows`).
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
from servelab.lessons.triton_bench.experiment import poisson_sweep
from servelab.lessons.triton_bench.views import Capacity, batches_ran, device_use, queueing_view

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
    "poisson_sweep",
    "queue_is_the_clients_ahead",
    "queueing_grows",
    "queueing_view",
]
