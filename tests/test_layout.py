"""servelab's layout as servelab/__init__.py draws it: each folder imports only the folders below
it and the foundation modules, no module imports itself back through others, and each folder
says what it owns; and servelab/lessons as its __init__ draws it: a folder per notebook, whose
checks import none of its runs or views."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from servelab import paths

PACKAGE = paths.REPO_ROOT / "servelab"
DRAWN = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text())) or ""
# Top to bottom, as servelab/__init__.py draws them: a folder may import any folder after it.
LAYERS = re.findall(r"^    (\w+)/", DRAWN, re.M)
FOUNDATION = {path.stem for path in PACKAGE.glob("*.py")} - {"__init__", "__main__"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The servelab modules `path` imports, anywhere in it (a deferred import is an arrow too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("servelab"):
            if node.module == "servelab" or (PACKAGE / node.module.split(".", 1)[1].replace(".", "/")).is_dir():
                # `from servelab import paths`, `from servelab.triton import stats`: modules
                found |= {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("servelab")}
    return found


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {name: {m for m in imported_modules(path) if m in MODULES and m != name} for name, path in MODULES.items()}


def folder_of(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_every_folder_is_a_layer_and_every_top_level_module_a_foundation_the_package_names():
    assert {path.parent.name for path in PACKAGE.glob("*/__init__.py")} == set(LAYERS)
    bottom = DRAWN.split("At the bottom", 1)[1]
    assert sorted(module for module in FOUNDATION if not re.search(rf"\b{module}\b", bottom)) == []


@pytest.mark.parametrize("layer", [*LAYERS, "foundation"])
def test_a_folder_imports_only_the_folders_below_it_and_the_foundation_only_itself(layer):
    if layer == "foundation":
        mine, allowed = FOUNDATION, FOUNDATION
    elif layer == "service":  # every image installs servelab/service alone
        mine, allowed = {"service"}, {"service"}
    else:
        mine, allowed = {layer}, set(LAYERS[LAYERS.index(layer) :]) | FOUNDATION
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if folder_of(module) in mine
        for target in targets
        if folder_of(target) not in allowed
    )
    assert upward == []


def test_no_module_imports_itself_back():
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            module, trail = stack.pop()
            for target in GRAPH[module]:
                if target == start:
                    return [*trail, start]
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*trail, target]))
        return None

    cycles = [" -> ".join(cycle) for module in sorted(GRAPH) if (cycle := cycle_from(module))]
    assert cycles == []


@pytest.mark.parametrize("layer", LAYERS)
def test_each_folder_says_what_it_owns(layer):
    docstring = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text())) or ""
    assert len(docstring.split()) >= 15, f"servelab/{layer}/__init__.py says too little about what it owns"


def test_tests_share_code_through_tests_helpers_only():
    """A test module imports no other test module and no conftest (pytest imports those itself,
    under names of its own choosing): shared test code lives in tests/helpers/. The scripts
    the tests run in child processes count too, so the text is searched, not only the syntax."""
    other_test_code = re.compile(r"^\s*(?:from|import)\s+(?:tests\.(?!helpers\b)\w+|conftest\b)", re.MULTILINE)
    found = sorted(
        f"{path.relative_to(paths.REPO_ROOT)}: {match.group().strip()}"
        for path in (paths.REPO_ROOT / "tests").glob("*.py")
        for match in other_test_code.finditer(path.read_text())
    )
    assert found == []


# ---- servelab/lessons: a folder per notebook -------------------------------------------------------

LESSONS = PACKAGE / "lessons"
LESSON_FOLDERS = sorted(path.parent.name for path in LESSONS.glob("*/__init__.py"))


def lesson_of(module: str) -> str:
    """The lesson folder `module` belongs to ("" for servelab.lessons' own modules and the rest)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "lessons" else ""


def test_lessons_hold_the_shared_machinery_and_a_folder_per_lesson():
    assert {path.name for path in LESSONS.glob("*.py")} == {"__init__.py", "expectations.py", "predictions.py"}
    assert LESSON_FOLDERS, "no lesson folder found"


@pytest.mark.parametrize("lesson", LESSON_FOLDERS)
def test_a_lesson_folder_names_its_notebook_and_what_each_of_its_modules_holds(lesson):
    """A reader finds a check by its notebook's name: the folder says, first thing, which notebook it
    serves (a notebook imports only the folder that names it: tests/test_notebooks_sources.py), and
    what each of its modules holds."""
    docstring = ast.get_docstring(ast.parse((LESSONS / lesson / "__init__.py").read_text())) or ""
    assert re.search(r"notebooks/\w+\.py", docstring), f"servelab/lessons/{lesson} names no notebook"
    modules = {path.stem for path in (LESSONS / lesson).glob("*.py")} - {"__init__"}
    unnamed = sorted(module for module in modules if f"`{module}`" not in docstring)
    assert unnamed == [], f"servelab/lessons/{lesson} does not say what these modules hold: {unnamed}"


def test_a_lessons_checks_import_none_of_its_runs_or_views_and_no_lesson_another():
    """A check is a pure function of runs: its module imports, of its folder, only other checks
    and the records they read (runs.py), never what runs the loads (experiment.py) or prints
    (views.py); and a lesson imports, of servelab.lessons, only itself and the shared machinery."""
    assert any(lesson_of(module) for module in GRAPH), "the lessons' modules are in the import graph"
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if lesson_of(module)
        for target in targets
        if target.startswith("servelab.lessons.")
        and target not in ("servelab.lessons.expectations", "servelab.lessons.predictions")
        and (
            lesson_of(target) != lesson_of(module)
            or (
                module.rsplit(".", 1)[1].startswith("checks")
                and not target.rsplit(".", 1)[1].startswith(("checks", "runs"))
            )
        )
    )
    assert wrong == []


# ---- servelab/lab: parts, not mixins --------------------------------------------------------------


def declared_fields(node: ast.ClassDef) -> dict[str, bool]:
    """The names a class body annotates, each with whether it gives them a value there."""
    return {
        statement.target.id: statement.value is not None
        for statement in node.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    } | {
        target.id: True
        for statement in node.body
        if isinstance(statement, ast.Assign)
        for target in statement.targets
        if isinstance(target, ast.Name)
    }


def test_a_class_of_the_lab_inherits_no_fields_it_must_declare_again():
    """Issue 63: a class too long for one module becomes parts that each own their state (Lab's
    `measurer`, TritonSide's `configs`), not mixins that declare their host's fields without
    setting them. A base whose fields its subclasses set (run_accounts.Account's `field`) is an
    interface, not a mixin."""
    classes = {
        node.name: node
        for path in (PACKAGE / "lab").glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    mixins = sorted(
        f"{name}({base.id}): {field} is declared in {base.id} and set by neither"
        for name, node in classes.items()
        for base in node.bases
        if isinstance(base, ast.Name) and base.id in classes
        for field, valued in declared_fields(classes[base.id]).items()
        if not valued and not declared_fields(node).get(field, False)
    )
    assert any(base for node in classes.values() for base in node.bases), "the lab's classes are read"
    assert mixins == []


MODULE_LINE_LIMIT = 400  # the guide's: a longer module holds more than one job
LONGER_FOR_NOW = {
    "fastapi_pt/app.py": "the services' length awaits issue 62's decision",
    "fastapi_onnx/app.py": "the services' length awaits issue 62's decision",
}


def test_every_tracked_python_file_is_at_most_400_lines_but_those_named_with_a_reason():
    listed = ["git", "ls-files", "--cached", "*.py"]
    tracked = subprocess.run(listed, cwd=paths.REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    lines = {name: len((paths.REPO_ROOT / name).read_text().splitlines()) for name in tracked}
    too_long = {name: n for name, n in lines.items() if n > MODULE_LINE_LIMIT and name not in LONGER_FOR_NOW}
    assert not too_long, f"over {MODULE_LINE_LIMIT} lines (split each by job): {too_long}"
    fitting = [name for name in LONGER_FOR_NOW if lines.get(name, 0) <= MODULE_LINE_LIMIT]
    assert not fitting, f"{fitting} fit (or are gone): take them out of LONGER_FOR_NOW"
