"""Notebook 8 (notebooks/8_io_vs_compute.py): I/O against compute, the download inside the predict
slot or outside it, and a burst of requests on N slots.

- `checks`: `slot_holds_only_inference` (the two designs, by number of senders) and
  `burst_waits_only_for_slots` (Truss's case), judged on the service's own stage times and
  counts; `queued_waits`, the wait a burst's requests expect;
- `experiment`: how many senders the runs use (`enough_senders`).

The notebook calls them by this folder's name (`io_vs_compute.enough_senders`).
"""

from servelab.lessons.io_vs_compute.checks import burst_waits_only_for_slots, queued_waits, slot_holds_only_inference
from servelab.lessons.io_vs_compute.experiment import enough_senders

__all__ = ["burst_waits_only_for_slots", "enough_senders", "queued_waits", "slot_holds_only_inference"]
