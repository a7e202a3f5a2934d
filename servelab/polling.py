"""Waiting on what another process counts, by reading it again until it stops changing.

A server counts a request, or logs a line about it, just after answering it: a reading taken the
moment the last answer arrives can miss it. `settled` reads until two readings in a row agree.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def settled(read: Callable[[], T], timeout_s: float = 2.0) -> T:
    """`read()` once two readings in a row are equal (everything answered has been counted), or
    its last reading after `timeout_s`. Servers count a request just after answering it."""
    previous = read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.05)
        current = read()
        if current == previous:
            return current
        previous = current
    return previous
