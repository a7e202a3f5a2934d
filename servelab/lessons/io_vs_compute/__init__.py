"""Notebook 8 (notebooks/8_io_vs_compute.py): I/O against compute, the download inside the predict
slot or outside it, and a burst of requests on N slots. `checks` judges them on the service's own
stage times and counts; `experiment` chooses how many senders the runs use.
"""

from servelab.lessons.io_vs_compute.checks import burst_waits_only_for_slots, queued_waits, slot_holds_only_inference
from servelab.lessons.io_vs_compute.experiment import enough_senders

__all__ = ["burst_waits_only_for_slots", "enough_senders", "queued_waits", "slot_holds_only_inference"]
