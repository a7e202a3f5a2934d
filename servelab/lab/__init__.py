"""What the notebooks call: `Lab.connect()` and the lab's methods on it.

- `facade`: `Lab`, the notebooks' one object: it finds or starts the services, runs the load
  generator and perf_analyzer, records every run and every verdict;
- `triton_side`, `ray_side`: Lab's methods for Triton and for Ray Serve;
- `run_accounts`: what Lab counts over a run besides the load generator's figures (the server's
  statistics, the machine's resources), set on the run before it is saved;
- `ui`: GourmetGram's client (an upload, as a browser sends it);
- `notebook_runs`: runs notebooks as a student does and keeps them with their outputs (each
  checks its own verdicts in `lab.verdicts()`);
- `source_excerpts`: the part of a service's source a notebook shows.

May import every other folder of servelab.
"""

from servelab.lab.facade import Lab

__all__ = ["Lab"]
