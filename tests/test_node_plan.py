"""Notebook 2's set-up (servelab.node_plan), computed from the figures it names (servelab.time_plan
sets it against the lease with the notebooks)."""

from __future__ import annotations

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


def test_every_download_and_step_says_where_its_figure_comes_from():
    for item in node_plan.GPU_DOWNLOADS:
        assert item.megabytes > 0 and item.source
    assert all(step.source for step in node_plan.setup_steps())
    assert "GB" in node_plan.setup_table() and "in the timed build" in node_plan.setup_table()
