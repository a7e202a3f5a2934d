"""Append-only files of JSON records, one per line, that survive the writer being killed.

Each record is written with a single `write` on a file opened for appending, then flushed to disk,
so a process killed at any moment leaves every earlier record whole, and two processes appending
to one file never interleave their lines. A reader skips a last line cut short (a machine that
lost power mid-write) and says so, instead of losing the whole file.
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
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
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
