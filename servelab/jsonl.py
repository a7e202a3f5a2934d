"""Append-only files of JSON records, one per line, that survive the writer being killed.

Each record is written with a single `write` on a file opened for appending, then flushed to disk,
so a process killed at any moment leaves every earlier record whole, and two processes appending
to one file never interleave their lines. A write can still be cut short: a large record, when the
writer is killed in the middle (Linux stops a write to a file between pages on SIGKILL), or when
the machine loses power. The next record then starts on a line of its own, and a reader skips the
line cut short and says so, instead of losing the whole file or the record after it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def append(path: Path, record: dict[str, Any], default: Callable[[Any], Any] | None = None) -> None:
    """Add `record` as one line at the end of `path` (created with its folders if missing)."""
    line = (json.dumps(record, default=default, separators=(",", ":")) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(descriptor).st_size
        if size and os.pread(descriptor, 1, size - 1) != b"\n":  # the last write was cut short
            line = b"\n" + line
        os.write(descriptor, line)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read(path: Path) -> list[dict[str, Any]]:
    """Every whole record of `path`, in order; none when it does not exist."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            log.warning("%s: line %d is not a whole record (cut short when it was written?); skipped", path, number)
    return records
