"""Every notebook, run as a student runs it (local services, quick profile), against the session's
servers: `Lab.connect()` in the notebook finds them, as it finds `make up` (tests/conftest.py).

A notebook that judges expectations (its source calls `lab.expect(` or `lab.judge(`) has every verdict checked
against the runs in its own tables: a verdict's conditions carry their figures with the run each
was read from (servelab.lessons.expectations), and each figure is read again from that run
(servelab.lab.notebook_runs), as the notebook's final table shows it; every run it kept is also
the one it saved to its file of runs.
A claim about what the lab's software does (not about speed) must also hold (MUST_HOLD): the test
that checked it before the notebook did is gone, and the notebook's check took its place.

One notebook alone: `make test-notebook NOTEBOOK=8_concurrency_target`.
"""

from __future__ import annotations

import pytest

from servelab.lab.notebook_runs import NOTEBOOKS, judging, run_notebook, verdict_problems
from servelab.lessons.expectations import Outcome
from tests.helpers import RETRIES

SOURCES = sorted(NOTEBOOKS.glob("[0-9]*.py"), key=lambda path: int(path.name.split("_")[0]))
MUST_HOLD = {
    # Was tests/test_ray_serve.py's two-node test.
    "8_concurrency_target": ["Serve spreads the replicas over both nodes, on loopback, and both serve requests"],
}


@pytest.mark.notebook
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", [source.stem for source in SOURCES])
def test_notebook_runs_against_the_lab_and_its_verdicts_use_its_own_numbers(name, model_servers, request):
    if "lab.ray_serve()" in (NOTEBOOKS / f"{name}.py").read_text():
        request.getfixturevalue("ray_serve")  # started once, shared by the notebooks and tests that use it
    seen: list[str] = []
    try:
        dump = run_notebook(f"{name}.ipynb", timeout_s=1200, retries_seen=seen)
    finally:  # the retries its tooling made, listed with the suite's own (servelab.retries)
        RETRIES.lines += [f"{RETRIES.test}: {line}" for line in seen]
    if dump is None:
        assert f"{name}.ipynb" not in judging()
        return
    assert verdict_problems(f"{name}.ipynb", dump) == []
    outcomes = dict(dump["outcomes"])
    for claim in MUST_HOLD.get(name, []):
        assert outcomes.get(claim) == Outcome.HELD.value, f"{name}: {claim!r} is {outcomes.get(claim)}"


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
        "4_fastapi_bench",
        "6_triton_bench",
        "7_io_vs_compute",
        "8_concurrency_target",
        "9_cancellation",
        "10_stateful_sequences",
    } <= {name.removesuffix(".ipynb") for name in judging()}
    for name in judging():
        assert (NOTEBOOKS / name).is_file(), f"{name} is not generated: run `make notebooks`"
    for name, claims in MUST_HOLD.items():
        assert all(f'"{claim}"' in (NOTEBOOKS / f"{name}.py").read_text() for claim in claims), name
