"""Notebook 4 (notebooks/4_fastapi_bench.py): benchmarking the FastAPI service.

- `checks`: GourmetGram's labels for its samples (`samples_get_their_labels`), PyTorch against
  ONNX Runtime (`runtime_comparison`), one user against sixteen (`queueing_under_load`,
  `health_stays_out_of_the_queue`, and on a GPU `gpu_has_time_to_spare`), and processes
  (`processes_follow_the_plan`);
- `checks_threads`: the thread plans, alone and under load (`crowded_threads_are_slower`,
  `every_core_serves_one_faster`, `default_near_the_best`);
- `runs`: the plans the runs are served with (`CorePlans`: the thread plans, none on a GPU, and the
  services' plan of processes, for the cores the notebook may use), and so what the notebook asks
  on this machine (its `describe` and `questions`);
- `experiment`: the watch kept beside the 16-sender run (`LoadWatch`), which shows what it sampled;
- `views`: what /openapi.json says about /predict (`describe_predict`) and a run's resources in
  words (`usage_text`).

Each check is a function of the runs, judged on the services' own timing of each stage, and reads
the machine's hardware itself where the notebook leaves it out. The notebook calls them by this
folder's name (`fastapi_bench.runtime_comparison`).
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
