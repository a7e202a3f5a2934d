"""Notebook 9 (notebooks/9_concurrency_target.py): Ray Serve's concurrency target
(`max_ongoing_requests`), its autoscaler (`target_ongoing_requests`), its queue in front of the
replicas, and the same limits in FastAPI and Triton.

- `checks_scaling`: the step loads' expectations (`scales_on_the_target`, `scaling_rules`,
  `queue_in_front`), judged on Serve's samples of itself;
- `checks_limits`: the predict slots and the bounded queues (`slots_need_room`,
  `bounded_queue_refuses`, `fastapi_queues_inside`), judged on the services' own /metrics;
- `checks_replicas`: replicas that add capacity, or stop at full cores (`replicas_add_capacity`),
  and two nodes (`spread_over_nodes`);
- `runs`: what the checks read: a step load (`Step`, `StepLoad`) and the figures read from runs
  (`busy_slots`);
- `views`: the step load's table and the slots' table;
- `experiment`: the two-node Ray cluster on this machine (`two_node_cluster`), its report.

What runs the other loads is the notebook's Lab (servelab.lab.ray_side), which this layer does not
import. The notebook calls them by this folder's name (`concurrency_target.scaling_rules`).
"""

from servelab.lessons.concurrency_target.checks_limits import (
    bounded_queue_refuses,
    fastapi_queues_inside,
    refusal_ms,
    slots_need_room,
)
from servelab.lessons.concurrency_target.checks_replicas import (
    gpu_replicas_add_capacity,
    replicas_add_capacity,
    replicas_stop_at_full_cores,
    spread_over_nodes,
)
from servelab.lessons.concurrency_target.checks_scaling import queue_in_front, scales_on_the_target, scaling_rules
from servelab.lessons.concurrency_target.experiment import two_node_cluster
from servelab.lessons.concurrency_target.runs import SETTLE_S, Step, StepLoad, busy_slots
from servelab.lessons.concurrency_target.views import slot_table, step_table, step_view

__all__ = [
    "SETTLE_S",
    "Step",
    "StepLoad",
    "bounded_queue_refuses",
    "busy_slots",
    "fastapi_queues_inside",
    "gpu_replicas_add_capacity",
    "queue_in_front",
    "refusal_ms",
    "replicas_add_capacity",
    "replicas_stop_at_full_cores",
    "scales_on_the_target",
    "scaling_rules",
    "slot_table",
    "slots_need_room",
    "spread_over_nodes",
    "step_table",
    "step_view",
    "two_node_cluster",
]
