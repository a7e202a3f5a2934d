"""Run the lab's notebooks as a student runs them, and check every verdict they record against the
runs in their own tables.

    python -m servelab.lab.notebook_runs 3_fastapi.ipynb 4_fastapi_bench.ipynb ...

A notebook is executed from the top in a fresh kernel (nbclient), with one cell added at its end
that prints what its `lab` kept: each expectation's outcome, the figures its conditions read, its
runs, and the runs it saved. A notebook that judges expectations (its source calls `lab.expect(` or
`lab.judge(`) is then checked: a verdict's conditions carry their figures with the run each was read from
(servelab.lessons.expectations), and each figure is read again from that run, as the notebook's final
table shows it, so a verdict can only say what its table says; every run the notebook kept is
also the one it saved to its file of runs. tests/test_notebooks.py checks the notebooks this way
on local services; `make test-docker` in the Compose project's Jupyter container.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from servelab import paths, retries
from servelab.lessons.expectations import Outcome, read
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


def judging(folder: Path = NOTEBOOKS) -> list[str]:
    """The notebooks that judge expectations (their source calls `lab.expect(` or `lab.judge(`), by
    file name."""
    return sorted(
        source.with_suffix(".ipynb").name
        for source in folder.glob("[0-9]*.py")
        if any(call in source.read_text() for call in ("lab.expect(", "lab.judge("))
    )


def run_notebook(
    name: str, timeout_s: int = 1200, executed_to: Path | None = None, retries_seen: list[str] | None = None
) -> dict | None:
    """Execute notebooks/`name` from the top; for a notebook that judges expectations, what its
    `lab` kept, as an added last cell printed it (None for the others). With `executed_to`, the
    notebook with its outputs is written there; the lines its cells printed about a retry
    (servelab.retries) are added to `retries_seen`; both also when a cell fails."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    judged = name in judging()
    if judged:
        notebook.cells.append(nbformat.v4.new_code_cell(DUMP))
    client = NotebookClient(
        notebook, timeout=timeout_s, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    try:
        client.execute()
    finally:
        if executed_to is not None:
            executed_to.mkdir(parents=True, exist_ok=True)
            nbformat.write(notebook, executed_to / name)
        if retries_seen is not None:
            printed = (output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", []))
            retries_seen += [line for text in printed for line in text.splitlines() if retries.MARK in line]
    if not judged:
        return None
    output = "".join(item.get("text", "") for item in notebook.cells[-1].outputs)
    return json.loads(output.split(MARK, 1)[1])


def verdict_problems(name: str, dump: dict) -> list[str]:
    """Each way the verdicts of `name` (run_notebook's `dump`) disagree with its runs; none is a pass."""
    as_kept = [(run["target"], run["started_at"], run["requests"], run["interrupted_by"]) for run in dump["results"]]
    saved = [(run["target"], run["started_at"], run["requests"], run["interrupted_by"]) for run in dump["saved"]]
    problems = [] if saved == as_kept else [f"{name}: the saved runs are not those of its table"]
    if not dump["outcomes"]:
        problems.append(f"{name} recorded no expectation")
    known = {outcome.value for outcome in Outcome}
    problems += [
        f"{name}: {claim!r} has no known outcome: {found!r}" for claim, found in dump["outcomes"] if found not in known
    ]
    runs = {
        (result.label, item["started_at"]): result for item in dump["results"] for result in [RunResult.from_dict(item)]
    }
    from_runs = [item for item in dump["figures"] if item["run"] is not None]
    if not from_runs:
        problems.append(f"{name}: no verdict read a number from a run")
    for item in from_runs:
        run = runs.get((item["run"], item["started_at"]))
        if run is None:
            problems.append(f"{name}: a verdict used {item['name']} of {item['run']}, which is not in its table")
            continue
        again = read(run, item["field"])
        same = (math.isnan(again) and math.isnan(item["value"])) or math.isclose(
            again, item["value"], rel_tol=1e-6, abs_tol=1e-12
        )
        if not same:
            problems.append(f"{name}: {item['name']} is {item['value']} in a verdict but {again} in its table")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab.lab.notebook_runs", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", help="file names in notebooks/, e.g. 4_fastapi_bench.ipynb")
    parser.add_argument("--executed-to", type=Path, help="a folder to write each notebook to, with its outputs")
    args = parser.parse_args(argv)
    failed = []
    for name in args.notebooks:
        started = time.monotonic()
        print(f"--- {name}: running", file=sys.stderr, flush=True)
        try:
            dump = run_notebook(name, executed_to=args.executed_to)
        except Exception as exc:  # a failing cell: nbclient's message names it and quotes the traceback
            print(f"FAILED {name}: {exc}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        problems = verdict_problems(name, dump) if dump is not None else []
        outcomes = (
            ", ".join(f"{claim}: {outcome}" for claim, outcome in (dump or {}).get("outcomes", [])) or "no verdicts"
        )
        took = time.monotonic() - started
        if problems:
            failed.append(name)
            print(f"FAILED {name} ({took:.0f} s): " + "; ".join(problems), file=sys.stderr, flush=True)
        else:
            runs = len(dump["results"]) if dump else 0
            print(f"PASSED {name} ({took:.0f} s, {runs} runs): {outcomes}", file=sys.stderr, flush=True)
    print(f"{len(args.notebooks) - len(failed)} passed, {len(failed)} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
