"""Notebook 2's set-up (servelab.node_plan), computed from the figures it names (servelab.time_plan
sets it against the lease with the notebooks): each stage of the node's build from what it
downloads at a stated rate, or from its time measured on the node once there is one."""

from __future__ import annotations

import json

import pytest

from servelab import node_build, node_plan


def test_each_stage_s_minutes_are_its_downloads_at_the_rate_given_and_the_time_to_start():
    for stage in node_build.STAGES:
        megabytes = sum(item.megabytes for item in node_plan.DOWNLOADS[stage.name])
        slow, fast = node_plan.stage_step(stage.name, 25, {}), node_plan.stage_step(stage.name, 100, {})
        start = node_plan.COMPOSE_UP_S / 60
        assert slow.minutes == pytest.approx(megabytes / 25 / 60 + start)
        assert slow.minutes - start == pytest.approx(4 * (fast.minutes - start))
        assert f"{megabytes / 1000:.1f} GB at 25 MB/s" in slow.source


def test_the_planning_rate_is_the_original_lab_s_15_gb_in_20_minutes_and_triton_s_base_is_counted():
    assert node_plan.PLANNING_DOWNLOAD_MB_PER_S == pytest.approx(12.5)
    (base,) = [item for item in node_plan.DOWNLOADS["triton"] if "tritonserver:24.10-py3" in item.what]
    assert base.megabytes == 15000 and "original lab" in base.source


def test_notebook_2_waits_for_the_first_stage_only_triton_s_builds_behind_it():
    steps = node_plan.setup_steps(measured={})
    assert [step.what for step in steps][-1] == f"build {node_build.stage('fastapi').what}"
    assert not any("Triton" in step.what for step in steps)
    assert "in the background" in node_plan.triton_step(measured={}).what


def test_a_stage_measured_on_the_node_replaces_its_estimate(tmp_path):
    measured = {"triton": {"seconds": 1500, "date": "2026-12-01", "machine": "P100 node", "mode": "build"}}
    (tmp_path / "node_build_times.json").write_text(json.dumps(measured))
    read = node_plan.measured_times(tmp_path / "node_build_times.json")
    triton = node_plan.triton_step(measured=read)
    assert triton.minutes == 25 and triton.source == "measured on the node P100 node, 2026-12-01"
    assert node_plan.stage_step("fastapi", 12.5, read).source.endswith("and 35 s to start")
    assert node_plan.measured_times(tmp_path / "none.json") == {}


def test_every_download_and_step_says_where_its_figure_comes_from():
    assert set(node_plan.DOWNLOADS) == {stage.name for stage in node_build.STAGES}
    for items in node_plan.DOWNLOADS.values():
        assert all(item.megabytes > 0 and item.source for item in items)
    assert all(step.source for step in node_plan.setup_steps())
    table = node_plan.setup_table()
    assert "GB at 12.5 MB/s" in table and "| triton | NVIDIA's Triton image" in table
