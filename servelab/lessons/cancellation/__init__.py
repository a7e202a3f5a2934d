"""Notebook 10 (notebooks/10_cancellation.py): requests and streams whose client has left; and its
appendix (notebooks/appendix_triton_crash.py): Triton 2.51's cancellation race. `checks` judges
notebook 10, `race_checks` the appendix (on what the race probe saw at each deadline); `experiment`
runs both notebooks' loads through their Lab (`LabLike`); `views` holds their tables and plots.
"""

from servelab.lessons.cancellation.checks import (
    abandoning_cuts_the_waste,
    ray_drops_gone_requests,
    stream_stops_at_the_next_step,
    triton_cancels_over_grpc,
    waste_without_cancellation,
)
from servelab.lessons.cancellation.experiment import (
    Experiment,
    LabLike,
    ProbeTarget,
    cancellation_probe,
    inferences_computed,
    pacing,
    probe_server,
    wasted_inferences,
)
from servelab.lessons.cancellation.race_checks import RaceProbe, triton_cancellation_race
from servelab.lessons.cancellation.views import probe_rows, stream_rows

__all__ = [
    "Experiment",
    "LabLike",
    "ProbeTarget",
    "RaceProbe",
    "abandoning_cuts_the_waste",
    "cancellation_probe",
    "inferences_computed",
    "pacing",
    "probe_rows",
    "probe_server",
    "ray_drops_gone_requests",
    "stream_rows",
    "stream_stops_at_the_next_step",
    "triton_cancellation_race",
    "triton_cancels_over_grpc",
    "waste_without_cancellation",
    "wasted_inferences",
]
