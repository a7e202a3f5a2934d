"""Parts of a source file, found by name, for a notebook to print: the definitions it discusses,
exactly as written now. A whole file buries them in its length; a range of lines shows the wrong
lines as soon as the file changes.

A definition is named as Python names it: "PredictRequest", or a dotted path through the
definitions around it: "create_app.predict" (a function defined inside create_app),
"FastAPIBackend.predict" (a method). Each is found in the file's syntax tree (ast) and printed
whole, with its decorators and its comments, dedented.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from servelab import paths

Definition = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef


def definition(source: str, name: str) -> str:
    """The source of the definition called `name` in `source`, decorators included, dedented."""
    found = _find(ast.parse(source), name)
    first = min([found.lineno, *(decorator.lineno for decorator in found.decorator_list)])
    return textwrap.dedent("\n".join(source.splitlines()[first - 1 : found.end_lineno]))


def _find(tree: ast.Module, name: str) -> Definition:
    scope: ast.Module | Definition = tree
    for part in name.split("."):
        here = [node for node in scope.body if isinstance(node, Definition)]
        matches = [node for node in here if node.name == part]
        if not matches:
            where = "the module" if isinstance(scope, ast.Module) else scope.name
            raise LookupError(f"{name}: {where} defines no {part!r}; it defines {sorted({n.name for n in here})}")
        scope = matches[-1]  # defined twice: the later definition is the one Python keeps
    assert not isinstance(scope, ast.Module), "a name has at least one part"
    return scope


def excerpt(path: Path, *names: str) -> str:
    """Each named definition of the file at `path`, under a comment that names the file and the
    definition, one blank line between them."""
    source = path.read_text()
    shown = path.relative_to(paths.REPO_ROOT) if path.is_relative_to(paths.REPO_ROOT) else path
    return "\n\n".join(f"# {shown}: {name}\n{definition(source, name)}" for name in names)
