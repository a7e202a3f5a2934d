"""The time plan (servelab.time_plan): each notebook's time computed from its words, its measured
run time and its steps, part 2 every lesson after part 1, and part 1 fitting the lease with room.
What `make notebooks` writes from it (each notebook's time, docs/time-plan.md): tests/test_build_notebooks.py."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from servelab import node_plan, time_plan
from servelab.lab import notebook_runs

SOURCE = """# %% [markdown]
# # 9. A title
#
# Four words of prose.

# %%
print("code is not prose")

# %% [markdown]
# Predict, and then **Your turn**: type it.

# %%
predicted_growth = None  # True or False
# Your turn: x = ..., a number.
### BEGIN SOLUTION
x = 1
### END SOLUTION
"""


def test_prose_is_the_markdown_cells_words_and_a_step_is_an_answer_the_student_types():
    assert time_plan.prose_words(SOURCE) == 3 + 4 + 7  # "9. A title", "Four words...", the last cell
    assert time_plan.count_steps(SOURCE) == (1, 1)
    assert time_plan.count_steps("# %% [markdown]\n# **Your turn**: type it.\n") == (0, 0), "only a typed answer counts"
    assert time_plan.count_steps("# %%\nx = predicted_growth\n") == (0, 0), "a prediction is set, not read"


def test_a_notebook_s_minutes_add_reading_running_and_hands_on(tmp_path):
    (tmp_path / "9_toy.py").write_text(SOURCE)
    (tmp_path / "run_times.json").write_text(json.dumps({"9_toy": {"seconds": 120, "date": "d", "machine": "m"}}))
    (toy,) = time_plan.plan(tmp_path)
    assert toy.reading_minutes == pytest.approx(14 / time_plan.READING_WORDS_PER_MINUTE)
    assert toy.run_minutes == 2.0 and "measured d, full profile, m" == toy.run_source
    assert toy.hands_on_minutes == time_plan.HANDS_ON_MINUTES + time_plan.PREDICTION_MINUTES
    assert toy.minutes == pytest.approx(toy.reading_minutes + 2.0 + toy.hands_on_minutes)


MACHINE_ONLY = """# %% [markdown]
# # 4. A title

# %%
predicted_load = None  # asked everywhere

# %% tags=["cpu_only"]
predicted_threads = None  # on a CPU
predicted_cores = None
# Your turn: plans = ...
### BEGIN SOLUTION
plans = 4
### END SOLUTION

# %% tags=["gpu_only"]
predicted_gpu_use = None  # on a GPU
"""


def test_a_notebook_s_cells_for_one_machine_count_only_on_that_machine_s_plan(tmp_path):
    """Part 1 runs on the GPU node: a CPU-only cell's steps, predictions and recorded seconds are left
    out of its time there, a GPU-only cell's counted; the other machine's time is stated beside it."""
    assert time_plan.count_steps(MACHINE_ONLY, time_plan.GPU) == (0, 2)
    assert time_plan.count_steps(MACHINE_ONLY, time_plan.CPU) == (1, 3)
    (tmp_path / "4_toy.py").write_text(MACHINE_ONLY)
    (tmp_path / "9_toy.py").write_text(MACHINE_ONLY.replace("# 4. A title", "# 9. A title"))
    runs = {"seconds": 300, "cpu_only_seconds": 120, "date": "d", "machine": "m"}
    (tmp_path / "run_times.json").write_text(json.dumps({"4_toy": runs, "9_toy": runs}))
    node, anywhere = time_plan.plan(tmp_path)
    assert (node.machine, node.run_minutes, node.hands_on, node.predictions) == (time_plan.GPU, 3.0, 0, 2)
    assert node.run_source == "measured d, full profile, m, less its CPU-only cells' 120 s"
    assert (anywhere.machine, anywhere.run_minutes, anywhere.hands_on, anywhere.predictions) == ("cpu", 5.0, 1, 3)
    assert node.elsewhere == pytest.approx(node.reading_minutes + 5.0 + time_plan.HANDS_ON_MINUTES + 3)
    assert f"hands-on; {round(node.elsewhere)} without a GPU; `python" in node.statement()
    assert f"hands-on; {round(anywhere.elsewhere)} on a GPU; `python" in anywhere.statement()
    plain = time_plan.notebook_time(tmp_path / "4_toy.py", {"4_toy": runs}, 12.5, time_plan.CPU)
    assert plain.machine == time_plan.CPU and plain.run_minutes == 5.0


def test_notebook_2_runs_as_long_as_the_node_takes_to_come_up_at_the_rate_given(tmp_path):
    (tmp_path / "2_bring_up_node.py").write_text(SOURCE)
    (slow,) = time_plan.plan(tmp_path, download_mb_per_s=5)
    (fast,) = time_plan.plan(tmp_path, download_mb_per_s=500)
    assert slow.run_minutes == pytest.approx(sum(step.minutes for step in node_plan.setup_steps(5)))
    assert slow.run_minutes > fast.run_minutes and "node_plan" in slow.run_source


def test_a_notebook_with_no_measured_run_time_says_how_to_measure_it(tmp_path):
    (tmp_path / "9_toy.py").write_text(SOURCE)
    with pytest.raises(time_plan.NotMeasured, match=r"LAB_PROFILE=full .*notebook_runs 9_toy.ipynb --record-times"):
        time_plan.plan(tmp_path)


def test_a_notebook_s_title_is_the_heading_it_opens_with():
    assert time_plan.title(SOURCE) == "9. A title"
    with pytest.raises(ValueError, match="no title"):
        time_plan.title("# %%\nx = 1\n\n# %% [markdown]\n# # 9. A title\n")


def test_part_2_is_every_lesson_after_part_1_and_an_appendix_comes_last_in_neither(tmp_path):
    names = ("appendix_probe", "12_added", "10_last", "7_in_the_lease", "9_toy")
    for name in names:
        (tmp_path / f"{name}.py").write_text(SOURCE)
    (tmp_path / "run_times.json").write_text(
        json.dumps({name: {"seconds": 60, "date": "d", "machine": "m"} for name in names})
    )
    times = time_plan.plan(tmp_path)
    assert [(time.name, time.part) for time in times] == [
        ("7_in_the_lease", 1),
        ("9_toy", 2),
        ("10_last", 2),
        ("12_added", 2),
        ("appendix_probe", None),
    ]
    assert time_plan.part_minutes(times, 2) == pytest.approx(3 * times[-1].minutes)
    page = time_plan.plan_page(times)
    assert "## Part 2, anywhere (notebooks 9-12):" in page and "- `12_added`: 9. A title" in page


def test_part_1_fits_the_lease_with_half_an_hour_to_spare():
    times = time_plan.plan()
    used = time_plan.part_1_minutes(times)
    assert node_plan.LEASE_MINUTES - used >= 30, time_plan.lease_table(times)
    assert f"{node_plan.LEASE_MINUTES - used:.0f} of the lease's 180 minutes left" in time_plan.lease_table(times)
    slower = time_plan.plan(download_mb_per_s=5)
    assert time_plan.part_1_minutes(slower, 5) > time_plan.part_1_minutes(times)


def test_notebook_5_waits_for_what_triton_s_build_takes_beyond_notebooks_3_and_4():
    times = time_plan.plan()
    fastapi = sum(time.minutes for time in times if time.number in (3, 4))
    for rate in (5, 12.5, 500):
        build = node_plan.triton_step(rate).minutes
        assert time_plan.triton_wait_minutes(times, rate) == pytest.approx(max(0.0, build - fastapi))
    assert time_plan.triton_wait_minutes(times, 5) > 0 and time_plan.triton_wait_minutes(times, 500) == 0
    slow = time_plan.part_1_minutes(times, 5) - time_plan.part_minutes(times, 1)
    assert slow == pytest.approx(time_plan.triton_wait_minutes(times, 5) + time_plan.WRAP_UP_MINUTES)
    assert "| wait for Triton's image, built during notebooks 3 and 4 |" in time_plan.lease_table(times, 5)


def test_a_run_time_is_recorded_by_notebook_in_order_and_only_in_the_full_profile(tmp_path, monkeypatch):
    path = tmp_path / "run_times.json"
    notebook_runs.record_time("appendix_extra.ipynb", 30, path)
    notebook_runs.record_time("10_last.ipynb", 61.4, path)
    notebook_runs.record_time("2_early.ipynb", 5.2, path)
    recorded = json.loads(path.read_text())
    assert list(recorded) == ["2_early", "10_last", "appendix_extra"] and recorded["10_last"]["seconds"] == 61
    assert "CPU cores" in recorded["2_early"]["machine"] and "cpu_only_seconds" not in recorded["2_early"]
    notebook_runs.record_time("4_tagged.ipynb", 300.2, path, cpu_only_seconds=119.6)
    assert json.loads(path.read_text())["4_tagged"]["cpu_only_seconds"] == 120
    monkeypatch.setattr(notebook_runs, "settings", lambda: SimpleNamespace(profile="quick"))
    with pytest.raises(SystemExit):
        notebook_runs.main(["3_fastapi.ipynb", "--record-times"])


def test_the_seconds_of_a_notebook_s_cpu_only_cells_are_read_from_nbclient_s_timing():
    import nbformat

    def cell(tags, started, replied):
        timing = {"iopub.execute_input": started, "shell.execute_reply": replied}
        return nbformat.v4.new_code_cell("x = 1", metadata={"tags": tags, "execution": timing})

    executed = nbformat.v4.new_notebook(
        cells=[
            cell(["cpu_only"], "2026-12-01T10:00:00.000000Z", "2026-12-01T10:01:30.500000Z"),
            cell([], "2026-12-01T10:01:31.000000Z", "2026-12-01T10:05:00.000000Z"),  # runs everywhere
            cell(["cpu_only"], "2026-12-01T10:05:00.000000Z", "2026-12-01T10:05:10.000000Z"),
            nbformat.v4.new_code_cell("y = 2", metadata={"tags": ["cpu_only"]}),  # never executed: no timing
        ]
    )
    assert notebook_runs.seconds_of_tagged_cells(executed) == pytest.approx(100.5)
