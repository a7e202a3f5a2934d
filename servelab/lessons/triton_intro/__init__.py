"""Notebook 5 (notebooks/5_triton.py): Triton's model repository and what Triton serves from it.
It judges no expectation, so it has no checks and runs no loads of its own:

- `views`: its printouts: a model folder drawn as `tree` does (`tree`), what Triton reports it
  serves beside what config.pbtxt asked for (`describe_served`), and how the config Triton loads
  differs from the one shipped (`changes_on_load`).

The notebook calls them by this folder's name (`triton_intro.tree`).
"""

from servelab.lessons.triton_intro.views import changes_on_load, describe_served, tree

__all__ = ["changes_on_load", "describe_served", "tree"]
