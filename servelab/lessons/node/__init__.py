"""Notebooks 0-2 (notebooks/0_intro.py, notebooks/1_reserve.py, notebooks/2_bring_up_node.py): where
the lab's services are, the lease's plan, and the GPU node reserved and set up with python-chi.

Standard library only, as every module it re-exports: notebooks 1 and 2 run on Chameleon's own
Jupyter server, where servelab is not installed and none of the lab's other packages are (each
notebook puts the repository root on `sys.path`; tests/test_notebooks_sources.py imports this
folder there without site-packages). It judges no expectation and runs no load, so it holds no
module of its own: it is the notebooks' door to the foundation modules they call,
- servelab.environment: where the services are (`current_services`), the guard of every
  Chameleon-only cell (`chameleon_only`) and the machine (`machine_info`);
- servelab.time_plan and servelab.node_plan: the lease's plan (notebook 1);
- servelab.node_setup, node_build and node_env: the node's checks, the lease, its images and
  Compose's `.env` there; servelab.settings' `repository_url`: the repository the node clones.

The notebooks import the names they call (`from servelab.lessons.node import chameleon_only`): the
guard is a bare name, as tests/test_notebooks_chi.py reads it.
"""

from servelab import node_build, node_env, node_plan, node_setup, time_plan
from servelab.environment import chameleon_only, current_services
from servelab.service.hardware import machine_info
from servelab.settings import repository_url

__all__ = [
    "chameleon_only",
    "current_services",
    "machine_info",
    "node_build",
    "node_env",
    "node_plan",
    "node_setup",
    "repository_url",
    "time_plan",
]
