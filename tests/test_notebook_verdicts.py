"""The notebooks that judge expectations (4 and 6 to 10 today), run as a student runs them (local
target, quick profile), and every verdict they record checked against the runs in their own tables;
every run they kept is also the one they saved to their file of runs (servelab.notebook_runs,
which `make test-docker` runs in the Compose project's Jupyter container too).

These notebooks run here rather than under nbmake, so that the suite executes them once: the root
conftest.py finds them (servelab.notebook_runs.judging: every notebook whose source calls
`lab.expect(`), so a new lesson's notebook is checked here with no edit to this file.
"""

from __future__ import annotations

import pytest

from conftest import JUDGED
from servelab.notebook_runs import NOTEBOOKS, run_notebook, verdict_problems


@pytest.mark.parametrize("name", JUDGED)
def test_every_verdict_uses_the_numbers_of_the_runs_in_its_tables(name, built_artifacts):
    assert verdict_problems(name, run_notebook(name)) == []


def test_a_verdict_that_reads_a_figure_its_table_does_not_show_is_a_problem():
    run = {"target": "t", "started_at": "2026-01-01T00:00:00", "requests": 1, "interrupted_by": []}
    dump = {"results": [], "saved": [run], "outcomes": [], "figures": [{"run": "x", "started_at": "s", "name": "n"}]}
    problems = verdict_problems("n.ipynb", dump)
    assert "n.ipynb: the saved runs are not those of its table" in problems
    assert "n.ipynb recorded no expectation" in problems
    assert "n.ipynb: a verdict used n of x, which is not in its table" in problems


def test_the_notebooks_that_judge_expectations_are_found_and_each_is_generated():
    # The lab's judging lessons as of this writing; a new one joins the list by itself.
    assert {
        "4_fastapi_bench.ipynb",
        "6_triton_bench.ipynb",
        "7_io_vs_compute.ipynb",
        "8_concurrency_target.ipynb",
        "9_cancellation.ipynb",
        "10_stateful_sequences.ipynb",
    } <= set(JUDGED)
    for name in JUDGED:
        assert (NOTEBOOKS / name).is_file(), f"{name} is not generated: run `make notebooks`"
