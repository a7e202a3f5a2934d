"""Progress bars for the lab's long runs, where someone watches: on a terminal (tqdm's text bar,
on stderr) and in a notebook's kernel (tqdm's notebook form, an ipywidgets bar in the cell's output).
Elsewhere (CI, a log file, `make test`) no bar is drawn: the caller logs a line instead of
thousands of carriage-return redraws.

- `bar`: a bar of counted things (requests, steps), with its ETA when their total is known;
- `timed`: a bar over a run's planned seconds, whose ETA is the run's end, for runs bounded by
  time (a load of 30 s has no total of requests to count towards), restarted when its measured
  part begins;
- `watched()`: where a bar would be seen: "notebook", "terminal" or None.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from tqdm import tqdm as text_tqdm

TICK_S = 0.5


def watched() -> str | None:
    """Where a bar drawn now is seen: "notebook" in a Jupyter kernel (what tqdm.auto draws there),
    "terminal" when stderr is one, None otherwise."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    if shell is not None and "IPKernelApp" in getattr(shell, "config", {}):
        return "notebook"
    return "terminal" if sys.stderr.isatty() else None


def bar(description: str, total: float | None, unit: str, shown: bool = True, **options: Any) -> text_tqdm:
    """A bar of `total` `unit`s (None: counted without a total, so without an ETA), drawn where it
    is watched: a widget in a notebook (tqdm's notebook form, with ipywidgets; its text on stderr
    where ipywidgets is missing), stderr on a terminal; a disabled one elsewhere or when not
    `shown`, whose updates cost nothing."""
    where = watched() if shown else None
    if where == "notebook":
        from tqdm.notebook import tqdm as notebook_tqdm

        with contextlib.suppress(ImportError):  # tqdm's: "IProgress not found" without ipywidgets
            return notebook_tqdm(total=total, desc=description, unit=unit, **options)
    return text_tqdm(total=total, desc=description, unit=unit, file=sys.stderr, disable=where is None, **options)


class TimedBar:
    """A bar over a run's planned seconds, moved by the clock: see `timed`."""

    def __init__(self, description: str, seconds: float, shown: bool) -> None:
        self.seconds = round(seconds, 1)
        self.bar = bar(
            description,
            self.seconds,
            "s",
            shown,
            leave=False,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]",
        )
        self.lock = threading.Lock()
        self.started = time.monotonic()

    def tick(self) -> None:
        with self.lock:
            self.bar.update(min(time.monotonic() - self.started, self.seconds) - self.bar.n)

    def restart(self, description: str, seconds: float) -> None:
        """Count `seconds` again from now (a run's measured part begins after its warm-up)."""
        with self.lock:
            self.bar.set_description_str(description, refresh=False)
            self.started, self.seconds = time.monotonic(), round(seconds, 1)
            self.bar.reset(total=self.seconds)


@contextlib.contextmanager
def timed(description: str, seconds: float, shown: bool = True) -> Iterator[TimedBar]:
    """A bar over `seconds` while the block runs, ticked by a thread of its own, its ETA the planned
    end; it stays at its end if the block runs longer, and is gone when the block ends."""
    timed_bar = TimedBar(description, seconds, shown)
    if timed_bar.bar.disable:
        yield timed_bar
        return
    done = threading.Event()

    def ticking() -> None:
        while not done.wait(TICK_S):
            timed_bar.tick()

    thread = threading.Thread(target=ticking, name="servelab-progress", daemon=True)
    thread.start()
    try:
        yield timed_bar
    finally:
        done.set()
        thread.join()
        timed_bar.bar.close()
