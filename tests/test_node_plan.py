"""Notebook 1's plan of the lease (servelab.node_plan): notebook 2's setup computed from the figures
it names, and the total set against the lease."""

from __future__ import annotations

import re

import pytest

from servelab import node_plan


def test_setup_adds_the_timed_build_and_only_what_it_did_not_download_at_the_rate_given():
    slow, fast = node_plan.setup_steps(25), node_plan.setup_steps(100)
    extra = sum(item.megabytes for item in node_plan.GPU_DOWNLOADS if not item.in_timed_build)
    assert 0 < extra < sum(item.megabytes for item in node_plan.GPU_DOWNLOADS)
    (download_slow,) = [step for step in slow if step.what.startswith("download")]
    (download_fast,) = [step for step in fast if step.what.startswith("download")]
    assert (
        download_slow.minutes == pytest.approx(extra / 25 / 60) and download_slow.minutes == 4 * download_fast.minutes
    )
    others = [(step.what, step.minutes) for step in slow if step is not download_slow]
    assert others == [(step.what, step.minutes) for step in fast if step is not download_fast]
    (build,) = [step for step in slow if step.what.startswith("build the images")]
    assert build.minutes == node_plan.CPU_VARIANT_BUILD_S / 60 and "measured" in build.source


def test_the_lease_plan_totals_its_rows_and_says_what_is_left():
    table = node_plan.lease_plan(50)
    rows = [line for line in table.splitlines()[2:] if not line.startswith("| **total**")]
    total = sum(float(line.split("|")[3]) for line in rows)
    setup = sum(step.minutes for step in node_plan.setup_steps(50))
    assert float(rows[0].split("|")[3]) == pytest.approx(round(setup))
    found = re.search(r"\*\*(\d+)\*\* \| (-?\d+) of the lease's 180 minutes left", table)
    assert found, table
    assert abs(int(found.group(1)) - total) <= len(rows) / 2  # each row is shown rounded
    assert int(found.group(2)) == node_plan.LEASE_MINUTES - int(found.group(1))
    slower = re.search(r"\*\*(\d+)\*\*", node_plan.lease_plan(5))
    assert slower and int(slower.group(1)) > int(found.group(1))


def test_every_download_and_step_says_where_its_figure_comes_from():
    for item in node_plan.GPU_DOWNLOADS:
        assert item.megabytes > 0 and item.source
    assert all(step.source for step in node_plan.setup_steps())
    assert "GB" in node_plan.setup_table() and "in the timed build" in node_plan.setup_table()
