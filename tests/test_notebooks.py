"""Every notebook, run as a student runs it (local target, quick profile), against the session's
servers: `Lab.connect()` in the notebook finds them, as it finds `make up` (tests/conftest.py).

A notebook that judges expectations (its source calls `lab.expect(`) has every verdict checked
against the runs in its own tables: a verdict's conditions carry their figures with the run each
was read from (servelab.expectations), and each figure is read again here from that run, as the
notebook's final table shows it; every run it kept is also the one it saved to its file of runs.
A claim about what the lab's software does (not about speed) must also hold (MUST_HOLD): the test
that checked it before the notebook did is gone, and the notebook's check took its place.

One notebook alone: `make test-notebook NOTEBOOK=8_concurrency_target`.
"""

from __future__ import annotations

import json
import math

import nbformat
import pytest
from nbclient import NotebookClient

from servelab import paths, retries
from servelab.expectations import Outcome, read
from servelab.results import RunResult
from tests.conftest import RETRIES

NOTEBOOKS = paths.REPO_ROOT / "notebooks"
SOURCES = sorted(NOTEBOOKS.glob("[0-9]*.py"), key=lambda path: int(path.name.split("_")[0]))
JUDGED = {source.stem for source in SOURCES if "lab.expect(" in source.read_text()}
MUST_HOLD = {
    # Was tests/test_ray_serve.py's two-node test.
    "8_concurrency_target": ["Serve spreads the replicas over both nodes, on loopback, and both serve requests"],
}
MARK = "VERDICTS:"
DUMP = f"""
import json as _json
from dataclasses import asdict as _asdict
print({MARK!r} + _json.dumps({{
    "figures": [_asdict(item) for item in lab.expectations.figures()],
    "outcomes": [[expectation.claim, expectation.outcome.value] for expectation in lab.expectations],
    "results": [result.to_dict() for result in lab.results],
    "saved": [result.to_dict() for result in Lab.saved_runs(lab.notebook)],
}}, default=str))
"""


def run_notebook(name: str) -> nbformat.NotebookNode:
    """Execute the notebook (its .ipynb, as a student opens it), with the verdict dump appended
    when it judges expectations; a cell that fails fails the test with the cell's traceback."""
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    if name in JUDGED:
        notebook.cells.append(nbformat.v4.new_code_cell(DUMP))
    client = NotebookClient(
        notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    try:
        client.execute()
    finally:
        # The retries the notebook's tooling made, listed with the suite's own (servelab.retries).
        for cell in notebook.cells:
            for output in cell.get("outputs", []):
                RETRIES.lines += [
                    f"{RETRIES.test}: {line}" for line in output.get("text", "").splitlines() if retries.MARK in line
                ]
    return notebook


def check_verdicts(name: str, dump: dict) -> None:
    results = {(item["target"], item["started_at"]): RunResult.from_dict(item) for item in dump["results"]}
    # Every run the notebook kept was saved as it ended, whole, under the notebook's own name.
    as_kept = lambda runs: [(run["target"], run["started_at"], run["requests"], run["interrupted_by"]) for run in runs]  # noqa: E731
    assert as_kept(dump["saved"]) == as_kept(dump["results"]), f"{name}: the saved runs are not those of its table"
    by_label = {(result.label, started): result for (_, started), result in results.items()}
    assert dump["outcomes"], f"{name} recorded no expectation"
    assert {outcome for _, outcome in dump["outcomes"]} <= {outcome.value for outcome in Outcome}
    from_runs = [item for item in dump["figures"] if item["run"] is not None]
    assert from_runs, f"{name}: no verdict read a number from a run"
    for item in from_runs:
        run = by_label.get((item["run"], item["started_at"]))
        assert run is not None, f"{name}: a verdict used {item['name']} of {item['run']}, which is not in its table"
        again = read(run, item["field"])
        assert (math.isnan(again) and math.isnan(item["value"])) or again == pytest.approx(item["value"]), item
    outcomes = dict(dump["outcomes"])
    for claim in MUST_HOLD.get(name, []):
        assert outcomes.get(claim) == Outcome.HELD.value, f"{name}: {claim!r} is {outcomes.get(claim)}"


@pytest.mark.notebook
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("name", [source.stem for source in SOURCES])
def test_notebook_runs_against_the_lab_and_its_verdicts_use_its_own_numbers(name, model_servers, request):
    if "lab.ray_serve()" in (NOTEBOOKS / f"{name}.py").read_text():
        request.getfixturevalue("ray_serve")  # started once, shared by the notebooks and tests that use it
    notebook = run_notebook(name)
    if name in JUDGED:
        output = "".join(item.get("text", "") for item in notebook.cells[-1].outputs)
        check_verdicts(name, json.loads(output.split(MARK, 1)[1]))


def test_the_notebooks_that_judge_expectations_are_found_and_each_is_generated():
    # The lab's judging lessons as of this writing; a new one joins the list by itself.
    assert {
        "4_fastapi_bench",
        "6_triton_bench",
        "7_io_vs_compute",
        "8_concurrency_target",
        "9_cancellation",
        "10_stateful_sequences",
    } <= JUDGED
    for name in JUDGED:
        assert (NOTEBOOKS / f"{name}.ipynb").is_file(), f"{name}.ipynb is not generated: run `make notebooks`"
    for name, claims in MUST_HOLD.items():
        assert all(f'"{claim}"' in (NOTEBOOKS / f"{name}.py").read_text() for claim in claims), name
