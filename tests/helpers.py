"""Small helpers the tests share: waiting on a state, never on a sleep a busy machine can outlast."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], timeout_s: float, what: str, every_s: float = 0.01) -> T:
    """Poll `check` until it returns something true, and return that; fail naming `what` (the
    state waited for) after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout_s:g} s for {what}")
        time.sleep(every_s)
    return found
