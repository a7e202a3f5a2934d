"""The GPU check's table as its tests read it: a column's heading, and the table in its output."""

from __future__ import annotations

CEILING = "ceiling: one in flight / one process / all processes (req/s)"


def table_of(stdout: str) -> list[dict[str, str]]:
    """The check's table, one dict per row, by heading."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    headings = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    return [dict(zip(headings, (c.strip() for c in line.strip("|").split(" | ")), strict=True)) for line in lines[2:]]
