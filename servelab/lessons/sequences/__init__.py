"""Notebook 11 (notebooks/11_stateful_sequences.py): stateful models and Triton's sequence batcher.
`checks` judges the batcher's strategies and the sequences that end idle, cancelled or too long, on
Triton's statistics or the specific refusal; `experiment` is `StatefulModel`, the notebook's way of
talking to the stateful model through its Lab (`SequenceLab`); `views` a frame's answer in one line.
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
