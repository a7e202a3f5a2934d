"""The headline benchmark (`python -m servelab bench`): every way the lab serves the model, measured
in one run on this machine and judged against the in-process ceiling measured in the same run.

- `setups`: what is measured (the served setups, the naive references, the ceilings) and the
  CPU split of a load point, shared by the run and its report;
- `run`: the run itself, measuring each setup `served` (its address, versions and thread plan)
  against its ceiling, each FastAPI service's `lone` client before and after a load, and the load
  generator's `agreement` with perf_analyzer; `goals`: its
  results judged (at c=64, the GPU check's load) or reported; `report`: report.md from its
  results; `naive_app`: the reference app a student writes first;
- `gpu_check`: `make test-gpu`, the lab's GPU path checked on any machine with an NVIDIA GPU, beside
  the benchmark (a package: its docstring lists its modules).

May import: lessons (notebook 6's checks, which gpu_check.notebook6 judges on a GPU), report, loadgen,
measure, stack, triton, service and the foundation modules.
"""
