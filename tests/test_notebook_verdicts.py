"""The notebooks that judge expectations (4 and 6 to 10 today), run as a student runs them (local
target, quick profile), and every verdict they record checked against the runs in their own tables;
every run they kept is also the one they saved to their file of runs.

A verdict's conditions carry their figures with the run each was read from (servelab.expectations).
Here each figure is read again from that run, as the notebook's final table shows it: a verdict
can only say what its table says. These notebooks run here rather than under nbmake, so that the
suite executes them once: the root conftest.py finds them (JUDGED: every notebook whose source
calls `lab.expect(`), so a new lesson's notebook is checked here with no edit to this file.
"""

from __future__ import annotations

import json
import math

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import JUDGED
from servelab import paths
from servelab.expectations import Outcome, read
from servelab.results import RunResult

NOTEBOOKS = paths.REPO_ROOT / "notebooks"
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


def run_notebook(name: str) -> dict:
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    notebook.cells.append(nbformat.v4.new_code_cell(DUMP))
    NotebookClient(
        notebook, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    output = "".join(item.get("text", "") for item in notebook.cells[-1].outputs)
    return json.loads(output.split(MARK, 1)[1])


@pytest.mark.parametrize("name", JUDGED)
def test_every_verdict_uses_the_numbers_of_the_runs_in_its_tables(name, built_artifacts):
    dump = run_notebook(name)
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
