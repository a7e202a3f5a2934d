"""Notebook 10 (notebooks/10_cancellation.py): requests and streams whose client has left; and its
appendix (notebooks/appendix_triton_crash.py): Triton 2.51's cancellation race.

- `checks`: notebook 10's expectations, each a function of its runs (`waste_without_cancellation`,
  `abandoning_cuts_the_waste`, `triton_cancels_over_grpc`, `ray_drops_gone_requests`,
  `stream_stops_at_the_next_step`);
- `race_checks`: the appendix's expectation (`triton_cancellation_race`), a function of what the
  race probe saw at each deadline (`RaceProbe`);
- `experiment`: what runs the loads: notebook 10's `Experiment` (each engine under patient and
  impatient clients, paced by `pacing`, and the inferences it computed for nobody), and the
  appendix's race probe (`probe_server`, `cancellation_probe`); both take the notebook's Lab
  (`LabLike`);
- `views`: the streams' table and the probe's, and notebook 10's plots.

The notebooks call them by this folder's name (`cancellation.Experiment`, `cancellation.pacing`).
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
