"""Notebook 9 (notebooks/9_concurrency_target.py): Ray Serve's concurrency target
(`max_ongoing_requests`), its autoscaler (`target_ongoing_requests`), its queue in front of the
replicas, and the same limits in FastAPI and Triton. `checks_scaling` judges the step loads on
Serve's samples of itself, `checks_limits` the predict slots and bounded queues on the services'
own /metrics, `checks_replicas` the replicas and the two nodes; `runs` is what they read (a step
load), `views` the tables, `experiment` the two-node Ray cluster. What runs the other loads is the
notebook's Lab (servelab.lab.ray_side), which this layer does not import.
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
