"""What a student must read in a notebook: its words of prose, and the lab names its cells use,
and the budgets tests/test_reading_budget.py holds every notebook to (the project's rules for its
own prose, not part of the lab a student runs).

A lab name is a name the student meets in a cell and would look up in the lab's package:
- a name imported from `servelab` (`Lab`, `plots`, `paths`, ...), counted by what is used of it:
  `Lab.connect`, `plots.plot_queueing` and `paths.REPO_ROOT` are three names, `plots` alone none;
- an attribute of the connected lab (`lab.table`), or of its Triton side (`lab.triton.perf`), or of
  its profile (`lab.profile.step_s`); what follows that (`lab.fastapi_urls.items`) is Python's.

A lesson's checks are counted apart: the function called in `lab.record(check(...))`, the one pattern
that judges a claim and carries the student's prediction, is a check, not a lab name (unless the
notebook also uses it otherwise); its arguments are read as any code.

    .venv/bin/python -m tests.helpers.reading_budget           # each notebook's words and lab names
    .venv/bin/python -m tests.helpers.reading_budget --names   # the lab names too
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from servelab.time_plan import NOTEBOOKS, code_cells, notebook_sources, prose_words

WORD_BUDGET = 1200
# Notebook 0 says what the whole lab is, where it runs and how a student arrives.
WORD_BUDGET_OF = {"0_intro": 1500}
LAB_NAME_BUDGET = 15

# Lab objects whose attributes are themselves lab objects: their attributes count one level deeper.
_NESTED = {("lab", "triton"), ("lab", "profile"), ("lab", "models")}


def python_code(source: str) -> str:
    """The code of a jupytext source's code cells, IPython's magics and shell lines left out."""
    lines = (line for cell in code_cells(source) for line in cell.splitlines())
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def _chain(node: ast.expr) -> list[str]:
    """`lab.triton.perf` as ["lab", "triton", "perf"]; [] where the chain starts with no name."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    return [node.id, *reversed(names)]


def _recorded_checks(tree: ast.AST) -> list[ast.expr]:
    """The callee of each `lab.record(check(...))`: the check's name as the cell writes it."""
    return [
        node.args[0].func
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and _chain(node.func) == ["lab", "record"]
        and node.args
        and isinstance(node.args[0], ast.Call)
    ]


def lesson_checks(source: str) -> set[str]:
    """The checks a notebook records (`lab.record(check(...))`), as the cells name them."""
    return {".".join(_chain(callee)) for callee in _recorded_checks(ast.parse(python_code(source)))} - {""}


def lab_names(source: str) -> set[str]:
    """The lab names a notebook's cells use, its checks apart (see the module's docstring)."""
    tree = ast.parse(python_code(source))
    checks = {id(node) for callee in _recorded_checks(tree) for node in ast.walk(callee)}
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab"):
            imported |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            imported |= {alias.asname or alias.name for alias in node.names if alias.name.startswith("servelab")}
    roots = imported | {"lab"}
    used: set[str] = set()
    bare = {
        node.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id in imported and id(node) not in checks
    }
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if id(node) in checks:
            continue
        outermost = isinstance(node, ast.Attribute) and not isinstance(parents.get(node), ast.Attribute)
        chain = _chain(node) if outermost and isinstance(node, ast.expr) else []
        if len(chain) < 2 or chain[0] not in roots:
            continue
        depth = 3 if tuple(chain[:2]) in _NESTED and len(chain) > 2 else 2
        used.add(".".join(chain[:depth]))
    # A name imported and used on its own (a function called, an exception caught) counts itself.
    used_as_root = {name.split(".")[0] for name in used}
    lone = {
        name
        for name in bare
        if name not in used_as_root
        or any(
            isinstance(node, ast.Name)
            and node.id == name
            and not isinstance(parents.get(node), ast.Attribute)
            and id(node) not in checks
            for node in ast.walk(tree)
        )
    }
    return used | lone


def word_budget(stem: str) -> int:
    return WORD_BUDGET_OF.get(stem, WORD_BUDGET)


def over_budget(path: Path) -> list[str]:
    """What of notebook `path` is over a budget, saying by how much."""
    source = path.read_text()
    words, names, budget = prose_words(source), lab_names(source), word_budget(path.stem)
    lines = [f"{path.name}: {words} words of prose, over the budget of {budget}"] if words > budget else []
    if len(names) > LAB_NAME_BUDGET:
        lines.append(f"{path.name}: {len(names)} lab names, over the budget of {LAB_NAME_BUDGET}: {sorted(names)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--names", action="store_true", help="list each notebook's lab names")
    parser.add_argument("--folder", type=Path, default=NOTEBOOKS)
    args = parser.parse_args(argv)
    print(
        f"| notebook | words (budget) | lab names (budget {LAB_NAME_BUDGET}) | checks |\n| --- | ---: | ---: | ---: |"
    )
    for path in notebook_sources(args.folder):
        source = path.read_text()
        names, checks = lab_names(source), lesson_checks(source)
        print(f"| {path.stem} | {prose_words(source)} ({word_budget(path.stem)}) | {len(names)} | {len(checks)} |")
        if args.names:
            print(f"|   | {', '.join(sorted(names))} | | {', '.join(sorted(checks))} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
