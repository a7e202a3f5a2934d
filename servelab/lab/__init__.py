"""What the notebooks call: `Lab.connect()` and the lab's methods on it.

`facade`'s `Lab` is the notebooks' one object; its parts, each with its own state: `measuring`
(`lab.measurer`: the load generator's runs), `run_keeper` (`lab.keeper`: keeps every run, waits
for the services), `triton_side` (`lab.triton`: perf_analyzer, capacity, and its `triton_configs`,
`lab.triton.configs`), `ray_side` (`lab.ray_serve()`), `run_accounts` (what a run counts besides
the load generator's figures), `connecting` (where the services are), `ui` (GourmetGram's client),
`your_turn` (a student's step) and `notebook_runs` (runs notebooks as a student does).

Of servelab, a notebook imports this folder and its own lesson folder (servelab.lessons), nothing
else (tests/test_notebooks_sources.py): what it needs beyond `Lab` is named here, `REPO_ROOT` (the
lab's files to read), `plots` (servelab.report.plots) and `StackError` (a service that would not start).

May import every other folder of servelab.
"""

from servelab.lab.facade import Lab
from servelab.paths import REPO_ROOT
from servelab.report import plots
from servelab.stack.supervision import StackError

__all__ = ["REPO_ROOT", "Lab", "StackError", "plots"]
