"""What the notebooks call: `Lab.connect()` and the lab's methods on it.

- `facade`: `Lab`, the notebooks' one object: it finds or starts the services, runs the load
  generator (those methods are written in `measuring`, mixed into Lab: `lab.concurrent(...)`,
  `lab.closed_loop(...)`), records every verdict, and hands the rest to its parts (each an object
  with a public interface):
- `run_keeper`: `RunKeeper` (`lab.keeper`) keeps every run (names it, marks it if a service
  crashed under it, saves it, loads saved runs back), tells the student of a service's exit, and
  waits for the services before each run;
- `triton_side`: `TritonSide` (`lab.triton`): perf_analyzer runs, capacity, Triton's model configs
  (those methods written in `triton_configs`, mixed into TritonSide);
- `ray_side`: `RayServe` (`lab.ray_serve()`): the Ray Serve to edit, redeploy and watch;
- `run_accounts`: what Lab counts over a run besides the load generator's figures (the server's
  statistics, the machine's resources), set on the run before it is saved;
- `ui`: GourmetGram's client (an upload, as a browser sends it);
- `notebook_runs`: runs notebooks as a student does and keeps them with their outputs (each
  checks its own verdicts in `lab.verdicts()`);

May import every other folder of servelab.
"""

from servelab.lab.facade import Lab

__all__ = ["Lab"]
