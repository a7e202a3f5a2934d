"""The tables the GPU check and notebook 6's claims print, as their tests read them; a column's heading."""

from __future__ import annotations

CEILING = "ceiling: one in flight / one process / all processes (req/s)"


def table_of(stdout: str) -> list[dict[str, str]]:
    """The table in `stdout`, one dict per row, by heading."""
    lines = [line for line in stdout.splitlines() if line.startswith("|")]
    headings = [cell.strip() for cell in lines[0].strip("|").split(" | ")]
    return [dict(zip(headings, (c.strip() for c in line.strip("|").split(" | ")), strict=True)) for line in lines[2:]]


def rows_by(stdout: str, heading: str) -> dict[str, dict[str, str]]:
    """The table in `stdout`, each row by its cell under `heading`."""
    return {row[heading]: row for row in table_of(stdout)}
