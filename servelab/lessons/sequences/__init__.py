"""Notebook 11 (notebooks/11_stateful_sequences.py): stateful models and Triton's sequence batcher.

- `checks`: the batcher's strategies and their cost (`batcher_merges_sequences`, `batching_pays`,
  `where_a_frame_waits`, `evictions_break_the_oldest`), and the sequences that end idle,
  cancelled or too long (`idle_and_cancelled_sequences`, `busy_sequence_times_out`, `refusal`);
- `experiment`: `StatefulModel`, the notebook's way of talking to the stateful model (frames by
  hand, runs of live sequences, the model's log, a config tried for a while), through the Lab
  (`SequenceLab`);
- `views`: a frame's answer in one line (`describe`).

Each check is a function of the runs and answers, judged on Triton's statistics or the specific
refusal. The notebook calls them by this folder's name (`sequences.batching_pays`).
"""

from servelab.lessons.sequences.checks import (
    NOT_STARTED,
    batcher_merges_sequences,
    batching_pays,
    busy_sequence_times_out,
    evictions_break_the_oldest,
    idle_and_cancelled_sequences,
    refusal,
    where_a_frame_waits,
)
from servelab.lessons.sequences.experiment import FRAME_OUTPUTS, SequenceLab, StatefulModel
from servelab.lessons.sequences.views import describe

__all__ = [
    "FRAME_OUTPUTS",
    "NOT_STARTED",
    "SequenceLab",
    "StatefulModel",
    "batcher_merges_sequences",
    "batching_pays",
    "busy_sequence_times_out",
    "describe",
    "evictions_break_the_oldest",
    "idle_and_cancelled_sequences",
    "refusal",
    "where_a_frame_waits",
]
