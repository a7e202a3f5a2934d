"""The virtualenv's set-up (scripts/bootstrap.sh, `make setup`): who gets which extra, PyTorch's CPU
builds where there is no NVIDIA GPU (requirements-cpu.lock), and a machine the lab cannot run on
without Docker, stopped before anything is created."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from servelab import paths

ROOT = paths.REPO_ROOT
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
# What only an instructor or the tests use: notebooks 1-2 on Chameleon (python-chi, Blazar's client),
# the students' copies (nbgrader, jupytext).
INSTRUCTOR_ONLY = {"python-chi", "python-blazarclient", "nbgrader", "jupytext"}
# The requirements of PyTorch's CPU build (the Requires-Dist of torch 2.13.0+cpu, from its own index):
# those of the registry's CUDA build less its CUDA libraries.
TORCH_CPU_REQUIRES = {"filelock", "typing-extensions", "setuptools", "sympy", "networkx", "jinja2", "fsspec"}


def folded(extra: str) -> set[str]:
    """The packages `extra` names, with those of the extras it names (servelab[...]) folded in."""
    names = set()
    for text in EXTRAS[extra]:
        requirement = Requirement(text)
        if requirement.name == "servelab":
            for named in requirement.extras:
                names |= folded(named)
        else:
            names.add(canonicalize_name(requirement.name))
    return names


def lock_entries(name: str) -> dict[str, tuple[str, set[str]]]:
    """A lock's pins, by canonical name: the version as written, and what the lock says needs it."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current = ""
    for line in (ROOT / name).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            package, _, version = line.partition("==")
            current = canonicalize_name(package)
            entries[current] = (version, set())
        elif via := re.match(r"\s+#\s+(?:via\s+)?([A-Za-z0-9._-]+)(?:\s|$)", line):
            if via.group(1) != "via":
                entries[current][1].add(canonicalize_name(via.group(1)))
    return entries


# ---- extras by who needs them -----------------------------------------------------------------


def test_the_student_s_extra_has_none_of_what_only_an_instructor_or_the_tests_use():
    student, instructor, tests = folded("lab"), folded("instructor"), folded("dev")
    assert not student & INSTRUCTOR_ONLY, student & INSTRUCTOR_ONLY
    assert INSTRUCTOR_ONLY <= instructor and student < instructor < tests
    # What `make up` starts and notebooks 0 and 3-11 run: the local Triton, perf_analyzer, PyTorch,
    # ONNX Runtime, JupyterLab, Ray Serve, GourmetGram and the image host.
    assert {
        "nvidia-pytriton",
        "tritonclient",
        "torch",
        "onnxruntime",
        "jupyterlab",
        "ray",
        "flask",
        "aiohttp",
    } <= student


def test_only_the_instructor_s_code_imports_what_the_student_s_extra_lacks():
    """A student's `make up` and notebooks never import python-chi, nbgrader or jupytext; the code that
    does is notebooks 1-2 (Chameleon's own Jupyter), `make notebooks` and the tests."""
    pattern = re.compile(r"^\s*(?:import|from)\s+(chi|blazarclient|nbgrader|jupytext)\b", re.M)
    importers = set()
    for path in [*ROOT.glob("servelab/**/*.py"), *ROOT.glob("notebooks/*.py"), *ROOT.glob("scripts/*.py")]:
        if pattern.search(path.read_text()):
            importers.add(str(path.relative_to(ROOT)))
    your_turn = (ROOT / "servelab" / "lab" / "your_turn.py").read_text()
    assert re.search(r"^    from nbgrader\.preprocessors import ClearSolutions", your_turn, re.M), "imported when run"
    assert importers == {
        "notebooks/1_reserve.py",
        "notebooks/2_bring_up_node.py",
        "scripts/build_notebooks.py",
        "servelab/lab/your_turn.py",
    }


@pytest.mark.parametrize(
    ("target", "extra"),
    [
        ("up", "lab"),
        ("bench", "lab"),
        ("artifacts", "lab"),
        ("notebooks", "instructor"),
        ("test", "dev"),
        ("test-fast", "dev"),
        ("setup", "dev"),
        ("lock", "dev"),
    ],
)
def test_each_make_target_installs_the_extra_its_users_need(target, extra):
    dry_run = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert f"bash scripts/bootstrap.sh {extra}\n" in dry_run


# ---- PyTorch's CPU builds ---------------------------------------------------------------------


def test_the_cpu_lock_is_the_lock_with_pytorch_s_cpu_builds_less_what_only_its_cuda_build_needs():
    full, cpu = lock_entries("requirements.lock"), lock_entries("requirements-cpu.lock")
    makefile = (ROOT / "Makefile").read_text()
    cuda_only = set(re.search(r"^TORCH_CUDA_ONLY := (.+)$", makefile, re.M).group(1).split())
    # The CUDA build's own requirements, as the lock records them: every one either the CPU build's
    # too, or left out of the CPU lock (cuda-bindings stays: tritonclient's cuda-python needs it).
    torch_needs = {name for name, (_, via) in full.items() if "torch" in via}
    assert torch_needs - TORCH_CPU_REQUIRES == cuda_only | {"cuda-bindings"}
    assert "tritonclient" in {via for via in full["cuda-python"][1]}
    # Left out: those, and what nothing else needs (the CUDA libraries they bring).
    left_out = set(cuda_only)
    while grown := {name for name, (_, via) in full.items() if via and via <= left_out} - left_out:
        left_out |= grown
    assert set(full) - set(cpu) == left_out and set(cpu) <= set(full)
    assert any(name.startswith("nvidia-cu") for name in left_out) and "nvidia-cuda-runtime-cu12" in cpu
    for name, (version, _) in cpu.items():
        expected = full[name][0] + ("+cpu" if name in ("torch", "torchvision") else "")
        assert version == expected, f"{name}: {version} in requirements-cpu.lock, {full[name][0]} in the lock"


def test_the_virtualenv_installs_pytorch_s_two_packages_alone_from_its_cpu_index_then_the_rest_at_the_lock():
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu" in bootstrap
    assert "grep -E '^(torch|torchvision)==' requirements-cpu.lock" in bootstrap
    assert '--no-deps --index-url "$TORCH_CPU_INDEX"' in bootstrap
    assert '"${pip[@]}" -c "$lock" -e ".[$EXTRA]"' in bootstrap
    # The one line that says which builds, and why.
    assert len(re.findall(r'^say "PyTorch: \$torch_from"$', bootstrap, re.M)) == 1
    assert bootstrap.count("torch_from=") == 3  # a GPU; no GPU, the CPU index; no GPU, no CPU index


# ---- a machine the local lab does not run on --------------------------------------------------


def run_bootstrap(tmp_path: Path, system: str, machine: str, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/bootstrap.sh, in a folder of its own (nothing of the clone's is touched), with a `uname`
    that says `system` and `machine`."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp_path / "scripts" / "bootstrap.sh")
    fake = tmp_path / "bin" / "uname"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\ncase "$1" in -s) echo {system} ;; -m) echo {machine} ;; *) exit 2 ;; esac\n')
    fake.chmod(0o755)
    environ = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}", **env}
    command = ["bash", str(tmp_path / "scripts" / "bootstrap.sh"), "lab"]
    return subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("system", "machine"), [("Darwin", "arm64"), ("Linux", "aarch64"), ("Darwin", "x86_64")])
def test_anything_but_linux_x86_64_is_told_to_use_docker_and_why_before_anything_is_created(tmp_path, system, machine):
    done = run_bootstrap(tmp_path, system, machine)
    assert done.returncode == 1
    assert f"This is {system} {machine}" in done.stderr
    assert "Linux x86_64 only" in done.stderr and "nvidia-pytriton" in done.stderr and "perf_analyzer" in done.stderr
    assert "docker compose up -d --build" in done.stderr and "docs/docker.md" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "scripts"], "no virtualenv, nothing else"


def test_linux_x86_64_passes_the_check(tmp_path):
    # The same fake says Linux x86_64: the script goes on, to its next check (a Python that is not there).
    done = run_bootstrap(tmp_path, "Linux", "x86_64", PYTHON=str(tmp_path / "no-python"))
    assert done.returncode == 1 and "Python 3.11 or newer is needed" in done.stderr
    assert "Linux x86_64 only" not in done.stderr
