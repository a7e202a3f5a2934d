"""Notebook 5 (notebooks/5_triton.py): Triton's model repository and what Triton serves from it.
It judges no expectation, so it has no checks and runs no loads of its own: `views` holds its
printouts (a model folder as `tree` draws it, what Triton serves beside what config.pbtxt asked
for, and how the config Triton loads differs from the one shipped).
"""

from servelab.lessons.triton_intro.views import changes_on_load, describe_served, tree

__all__ = ["changes_on_load", "describe_served", "tree"]
