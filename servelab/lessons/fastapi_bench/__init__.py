"""Notebook 4 (notebooks/4_fastapi_bench.py): benchmarking the FastAPI service. `checks` and
`checks_threads` (the thread plans' aside) judge the runs on the services' own timing of each stage;
`runs` holds the plans the runs are served with (`CorePlans`, for the cores the notebook may use),
and so what the notebook asks on this machine; `experiment` the watch kept beside the 16-sender
run; `views` what /openapi.json says about /predict and a run's resources in words.
"""

from servelab.lessons.fastapi_bench.checks import (
    SAMPLE_LABELS,
    gpu_has_time_to_spare,
    health_stays_out_of_the_queue,
    processes_follow_the_plan,
    queueing_under_load,
    runtime_comparison,
    samples_get_their_labels,
)
from servelab.lessons.fastapi_bench.checks_threads import (
    crowded_threads_are_slower,
    default_near_the_best,
    every_core_serves_one_faster,
)
from servelab.lessons.fastapi_bench.experiment import LoadWatch, health_check_ms, listening_pids
from servelab.lessons.fastapi_bench.runs import CorePlans
from servelab.lessons.fastapi_bench.views import describe_predict, usage_text

__all__ = [
    "SAMPLE_LABELS",
    "CorePlans",
    "LoadWatch",
    "crowded_threads_are_slower",
    "describe_predict",
    "default_near_the_best",
    "every_core_serves_one_faster",
    "gpu_has_time_to_spare",
    "health_check_ms",
    "health_stays_out_of_the_queue",
    "listening_pids",
    "processes_follow_the_plan",
    "queueing_under_load",
    "runtime_comparison",
    "samples_get_their_labels",
    "usage_text",
]
