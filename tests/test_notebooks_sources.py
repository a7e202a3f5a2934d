"""Notebooks are generated from their jupytext sources (`make notebooks`: scripts/build_notebooks.py,
which adds each one's time and the link to the next) and committed without outputs."""

import ast
import json
import re
import subprocess
import sys

import jupytext
import pytest

from servelab import paths
from servelab.lab.notebook_runs import NOTEBOOKS, judging, order, sources
from tests.helpers import file_module

SOURCES = sources()  # the numbered lessons (10 after 9, not after 1), then the appendices
# What `make notebooks` writes from the sources and the recorded run times, as it would write it now.
GENERATED, UNMEASURED = file_module(paths.REPO_ROOT / "scripts" / "build_notebooks.py").instructor_notebooks(NOTEBOOKS)


def test_every_notebook_has_a_source_and_the_sequence_is_complete():
    lessons = [source for source in SOURCES if source.name[0].isdigit()]
    assert [source.name.split("_")[0] for source in lessons] == [str(n) for n in range(len(lessons))]
    assert "appendix_triton_crash.py" in {source.name for source in SOURCES}
    assert sources(NOTEBOOKS, ".ipynb") == [source.with_suffix(".ipynb") for source in SOURCES]


def test_the_lessons_come_in_their_order_and_the_appendices_after_them():
    names = ["appendix_b.ipynb", "10_last.ipynb", "appendix_a", "9_cancellation", "0_intro.py"]
    assert sorted(names, key=order) == [
        "0_intro.py",
        "9_cancellation",
        "10_last.ipynb",
        "appendix_a",
        "appendix_b.ipynb",
    ]


def test_every_notebook_has_a_recorded_run_time_for_the_time_it_states():
    assert UNMEASURED == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_committed_notebook_is_what_make_notebooks_writes_without_outputs(source):
    """Its source's cells, its time (a changed run time or prose changes it), its link to the next and
    its time limits."""
    committed = jupytext.read(source.with_suffix(".ipynb"))
    as_pairs = lambda nb: [(cell.cell_type, cell.source.strip()) for cell in nb.cells]  # noqa: E731
    assert as_pairs(committed) == as_pairs(GENERATED[source]), f"{source.name} changed: run `make notebooks`"
    limits = ("execution", "servelab")  # the time limits nbmake runs it under
    assert {key: committed.metadata.get(key) for key in limits} == {
        key: GENERATED[source].metadata[key] for key in limits
    }
    for cell in json.loads(source.with_suffix(".ipynb").read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_notebook_that_measures_saves_its_runs_under_its_own_name(source):
    """Lab.connect's first argument names the file its runs are saved to (results/notebooks/)."""
    calls = re.findall(r"^lab = Lab\.connect\(([^)]*)\)", source.read_text(), flags=re.MULTILINE)
    for arguments in calls:
        assert arguments.split(",")[0].strip() == f'"{source.stem}"', f"{source.name}: Lab.connect({arguments})"


# ---- the notebooks' door: servelab.lab and their own lesson ---------------------------------------

PACKAGE = paths.REPO_ROOT / "servelab"


def lessons_of(source) -> set[str]:
    """The lesson folders that serve notebook `source`: those whose docstring names it, where a
    reader finds a notebook's checks (servelab/lessons/__init__.py)."""
    return {
        init.parent.name
        for init in (PACKAGE / "lessons").glob("*/__init__.py")
        if f"notebooks/{source.name}" in (ast.get_docstring(ast.parse(init.read_text())) or "")
    }


def servelab_imports(source) -> list[str]:
    """The servelab modules a notebook's source imports (a name that is not a module counts as its
    module's)."""
    found = []
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "servelab"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "servelab":
            for alias in node.names:
                inner = paths.REPO_ROOT.joinpath(*f"{node.module}.{alias.name}".split("."))
                is_module = inner.with_suffix(".py").is_file() or (inner / "__init__.py").is_file()
                found.append(f"{node.module}.{alias.name}" if is_module else node.module)
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_notebook_imports_of_servelab_only_the_lab_and_its_own_lesson(source):
    """The notebooks' door is narrow: servelab.lab (`Lab` and the few names beside it) and the lesson
    folder that names the notebook, whose folder re-exports what the notebook calls."""
    door = {"servelab.lab"} | {f"servelab.lessons.{lesson}" for lesson in lessons_of(source)}
    imported = servelab_imports(source)
    assert imported, f"{source.name} imports nothing of servelab"
    assert sorted(set(imported) - door) == [], f"{source.name}: only {sorted(door)}"


def test_the_door_test_sees_a_module_through_either_form_of_import(tmp_path):
    source = tmp_path / "3_fastapi.py"
    source.write_text(
        "from servelab.lab import Lab, ray_side\nfrom servelab import paths\nimport servelab.report.plots\n"
        "from servelab.lessons import node\nfrom servelab.lessons.fastapi_bench import CorePlans\n"
    )
    assert servelab_imports(source) == [
        "servelab.lab",
        "servelab.lab.ray_side",
        "servelab.paths",
        "servelab.report.plots",
        "servelab.lessons.node",
        "servelab.lessons.fastapi_bench",
    ]
    assert lessons_of(NOTEBOOKS / "7_triton_batching.py") == {"triton_bench"}
    assert lessons_of(NOTEBOOKS / "2_bring_up_node.py") == {"node"}


def test_the_notebooks_that_run_where_servelab_is_not_installed_import_it_from_the_standard_library():
    """Notebooks 0-2 put the repository root on sys.path and import their lesson from it: on
    Chameleon's own Jupyter server only the standard library is there, as in `python -S` (no
    site-packages), where their imports of servelab must still run."""
    stdlib_only = [source for source in SOURCES if "sys.path.insert(0, str(REPO_ROOT))" in source.read_text()]
    assert [source.stem for source in stdlib_only] == ["0_intro", "1_reserve", "2_bring_up_node"]
    for source in stdlib_only:
        imports = [
            ast.unparse(node)
            for node in ast.walk(ast.parse(source.read_text()))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("servelab")
        ]
        script = "\n".join([f"import sys; sys.path.insert(0, {str(paths.REPO_ROOT)!r})", *imports])
        ran = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd="/")
        assert imports and ran.returncode == 0, f"{source.name}:\n{ran.stderr}"


def lab_calls(source, method: str) -> list[ast.Call]:
    """The calls of `lab.<method>(...)` in a notebook's source, in order."""
    calls = [
        node
        for node in ast.walk(ast.parse(source.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == method
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "lab"
    ]
    return sorted(calls, key=lambda call: (call.lineno, call.col_offset))


@pytest.mark.parametrize("name", judging(), ids=lambda name: name.removesuffix(".ipynb"))
def test_a_judging_notebook_checks_its_verdicts_after_its_last_one(name):
    """`lab.verdicts()` checks every verdict against its table (servelab.lessons.expectations.verdict_problems),
    wherever the notebook runs: nbmake, JupyterLab, the Compose project's Jupyter."""
    source = NOTEBOOKS / name.replace(".ipynb", ".py")
    last_verdict = max(call.lineno for method in ("expect", "record") for call in lab_calls(source, method))
    checks = [call.lineno for call in lab_calls(source, "verdicts")]
    assert checks and max(checks) > last_verdict, f"{source.name}: no lab.verdicts() after its last verdict"


def test_notebook_9_records_the_two_node_claim_about_ray_serve():
    """A claim about what the lab's software does, not about speed, which must hold
    (tests/test_lessons_concurrency_target_capacity.py): the notebook's check took a test's place."""
    recorded = [ast.unparse(call.args[0]) for call in lab_calls(NOTEBOOKS / "9_concurrency_target.py", "record")]
    assert sum("concurrency_target.spread_over_nodes" in check for check in recorded) == 1


@pytest.mark.parametrize("source", [s for s in SOURCES if s.stem[0].isdigit()], ids=lambda p: p.name)
def test_a_lesson_s_title_carries_the_number_of_its_file(source):
    """A renumbered lab keeps its titles in step with its files: a student follows either."""
    number = source.stem.split("_", 1)[0]
    title = next(line for line in source.read_text().splitlines() if line.startswith("# # "))
    assert title.startswith(f"# # {number}. "), f"{source.name}: {title}"


def test_notebooks_4_to_7_hand_the_student_the_real_tools():
    """Issue 62: the student's own cells hold the tools, not a lab method in their place. Notebook 4's
    first measurement is a loop of `requests` in a thread pool, before the lab's generator; notebooks
    5-7 load the config.pbtxt the student edited with Triton's own client and read back what Triton
    serves; 6 and 7 run nvidia-smi beside a run, and change no config through the lab's reload."""

    def calls(stem: str) -> list[str]:
        tree = ast.parse((NOTEBOOKS / f"{stem}.py").read_text())
        found = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
        return [ast.unparse(node.func) for node in sorted(found, key=lambda node: (node.lineno, node.col_offset))]

    fastapi_bench = calls("4_fastapi_bench")
    assert fastapi_bench.index("ThreadPoolExecutor") < fastapi_bench.index("lab.sequential")
    assert "requests.post" in fastapi_bench[: fastapi_bench.index("lab.sequential")]
    for stem in ("5_triton", "6_triton_bench", "7_triton_batching"):
        made = calls(stem)
        assert {"triton.load_model", "triton.get_model_config"} <= set(made), stem
        assert "lab.triton.configs.apply_config" not in made, stem
    for stem in ("6_triton_bench", "7_triton_batching"):
        source = (NOTEBOOKS / f"{stem}.py").read_text()
        assert "lab.triton.configs.write_config" in calls(stem) and "config_file.write_text" in calls(stem), stem
        assert 'shutil.which("nvidia-smi")' in source and '["nvidia-smi", *query]' in source, stem
