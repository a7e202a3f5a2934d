"""What the notebooks call: `Lab.connect()` and the lab's methods on it.

- `facade`: `Lab`, the notebooks' one object: it finds or starts the services (where, in
  `connecting`), records every verdict, and hands the rest to its parts (each an object with a
  public interface, and its own state):
- `measuring`: `Measurer` (`lab.measurer`) runs the load generator against a service's address,
  each run counted and kept; Lab passes the notebooks' calls on (`lab.concurrent(...)`,
  `lab.closed_loop(...)`);
- `run_keeper`: `RunKeeper` (`lab.keeper`) keeps every run (names it, marks it if a service
  crashed under it, saves it, loads saved runs back), tells the student of a service's exit, and
  waits for the services before each run;
- `triton_side`: `TritonSide` (`lab.triton`): perf_analyzer runs, capacity, and Triton's model
  configs, a part of its own (`triton_configs`: `ServedConfigs`, `lab.triton.configs`), to which
  it passes the notebooks' calls (`lab.triton.write_config(...)`);
- `ray_side`: `RayServe` (`lab.ray_serve()`): the Ray Serve to edit, redeploy and watch;
- `run_accounts`: what Lab counts over a run besides the load generator's figures (the server's
  statistics, the machine's resources), set on the run before it is saved;
- `ui`: GourmetGram's client (an upload, as a browser sends it);
- `notebook_runs`: runs notebooks as a student does and keeps them with their outputs (each
  checks its own verdicts in `lab.verdicts()`);

Of servelab, a notebook imports this folder and its own lesson folder (servelab.lessons), nothing
else (tests/test_notebooks_sources.py): what it needs beyond `Lab` is named here, `REPO_ROOT` (the
lab's files to read: `REPO_ROOT / "fastapi_pt" / "app.py"`), `plots` (servelab.report.plots) and
`StackError` (a service that would not start).

May import every other folder of servelab.
"""

from servelab.lab.facade import Lab
from servelab.paths import REPO_ROOT
from servelab.report import plots
from servelab.stack.supervision import StackError

__all__ = ["REPO_ROOT", "Lab", "StackError", "plots"]
