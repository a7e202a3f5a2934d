"""A run's load, described once: how many senders, for how long, how patient.

`Load` is built where a closed loop is asked for (the command line, the Lab, a test) and passed
whole, through servelab.loadgen.sync's `closed_loop` and `stream_loop`, to the runner that sends
it (`run_closed`, `run_streams`), which reads what it needs and checks what only it requires (a
closed loop needs `requests` or `duration_s`; streams a `duration_s`). What holds for every closed
loop is checked here, once, as it is built. `SequenceLoad` does the same for a run of sequences
(`sequence_loop`, `run_sequences`).

An open loop (a rate, not senders) loads a server in other units: it keeps its own parameters
(servelab.loadgen.runners.run_open). Where the load goes is the run's `Endpoint`
(servelab.loadgen.endpoint).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """`concurrency` senders, each sending again once answered, until `requests` measured requests
    or `duration_s` seconds, whichever comes first, after an unmeasured warm-up of up to
    `warmup_requests` requests or `warmup_s` seconds. A sender waits `backoff_s` after a request
    that was not answered; `impatient` of the senders give up on a request after `patience_s`."""

    concurrency: int
    requests: int | None = None
    duration_s: float | None = None
    warmup_requests: int = 0
    warmup_s: float = 0.0
    backoff_s: float = 0.0
    impatient: int = 0
    patience_s: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.backoff_s < 0:
            raise ValueError("concurrency must be at least 1, and backoff_s not negative")
        if (self.requests is not None and self.requests < 1) or (self.duration_s is not None and self.duration_s <= 0):
            raise ValueError("requests and duration_s must be positive")
        if self.warmup_requests < 0 or self.warmup_s < 0:
            raise ValueError("warmup_requests and warmup_s must not be negative")
        if not 0 <= self.impatient <= self.concurrency:
            raise ValueError("impatient senders are 0 to concurrency")
        if self.patience_s is not None and self.patience_s <= 0:
            raise ValueError("patience_s must be positive (None: senders wait for their answer)")

    @property
    def warms_up(self) -> bool:
        return bool(self.warmup_requests or self.warmup_s)

    def warmup(self) -> Load:
        """The warm-up phase as a load of its own: the same senders, bounded by the warm-up's
        requests or seconds, all of them patient and without back-off."""
        return Load(self.concurrency, self.warmup_requests or None, self.warmup_s or None)

    def bounds(self) -> str:
        """The run's bounds in words: "100 requests or 5 s, whichever comes first"."""
        return bounds_in_words(self.requests, self.duration_s)


# Not a `Load`: a sequence's senders count sequences, not requests, each of `length` frames at a
# camera's pace, and have no back-off or impatience; a Load's fields would mean other things here.
@dataclass(frozen=True)
class SequenceLoad:
    """`concurrency` sequences live at once, each of `length` frames, until `sequences` have
    started or `duration_s` has passed, whichever comes first (`concurrency` sequences when neither
    is given). With `frame_interval_s`, each sequence's frames come due that far apart (None: each
    frame as soon as the previous one is answered). `warmup_sequences` run first, unmeasured."""

    concurrency: int
    length: int
    sequences: int | None = None
    duration_s: float | None = None
    frame_interval_s: float | None = None
    warmup_sequences: int = 0

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.length < 1 or self.warmup_sequences < 0:
            raise ValueError("concurrency and length must be at least 1, and warmup_sequences not negative")
        if (self.sequences is not None and self.sequences < 1) or (
            self.duration_s is not None and self.duration_s <= 0
        ):
            raise ValueError("sequences and duration_s must be positive")
        if self.frame_interval_s is not None and self.frame_interval_s <= 0:
            raise ValueError("frame_interval_s must be positive (None: each frame as soon as the previous is answered)")

    @property
    def sequences_to_start(self) -> int | None:
        """How many sequences the run starts at most: `sequences`, one per slot when the run has
        no bound, None when only `duration_s` bounds it."""
        return self.concurrency if self.sequences is None and self.duration_s is None else self.sequences

    def warmup(self) -> SequenceLoad:
        """The warm-up phase as a load of its own: `warmup_sequences` at the same concurrency and pace."""
        return SequenceLoad(self.concurrency, self.length, self.warmup_sequences, None, self.frame_interval_s)


def bounds_in_words(requests: int | None, duration_s: float | None) -> str:
    """A run's bounds in words (an open loop's too): "100 requests or 5 s, whichever comes first"."""
    parts = ([f"{requests} requests"] if requests is not None else []) + (
        [f"{duration_s:g} s"] if duration_s is not None else []
    )
    return " or ".join(parts) + (", whichever comes first" if len(parts) == 2 else "")
