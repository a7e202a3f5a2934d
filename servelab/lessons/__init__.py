"""The lessons' checks: each expectation a notebook judges, as a function of its runs.

A notebook states an expectation in prose, measures, then calls the check here that judges it,
and records the verdict with `lab.record(...)`. Each check returns a
`servelab.lessons.expectations.Expectation` whose conditions are judged on figures read from the runs
(`expectations.figure`), so a verdict can only say what the tables beside it say; its `reason`
is computed from the same runs (cores, device, measured costs), or says plainly that it is a
hypothesis. Living here, every check has a unit test that feeds it a failing case
(tests/test_lessons_*.py): a check that cannot fail teaches nothing.

One folder per notebook, named for the notebook (`fastapi_bench/` for notebooks/4_fastapi_bench.py;
`cancellation/` holds the appendix's race too), whose docstring names its notebook and each module:
- `checks.py` (or `checks_<topic>.py`, one per part of the notebook): its expectations, nothing
  else, each a pure function of runs; of the folder they import only other checks and `runs.py`
  (tests/test_layout.py holds them to it, and no lesson imports another);
- `experiment.py`: what runs its loads or configures the servers for it, beyond the Lab's own
  methods (which it takes as an argument, a Protocol: this layer imports nothing of servelab.lab);
- `views.py`: its tables and printed rows; `runs.py` where its checks read records of their own.
The notebook imports the folder (`from servelab.lessons import cancellation`), which re-exports
the names it calls: of servelab, a notebook imports only servelab.lab and the folder whose
docstring names it (tests/test_notebooks_sources.py). `node/` is notebooks 0-2's, standard
library only (they run on Chameleon's own Jupyter server, where servelab is not installed), so this
module imports nothing. `expectations.py` is the machinery every check shares, and `predictions.py`
what a student predicts before a check, said beside its verdict.
"""
