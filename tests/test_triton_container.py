"""The Triton container's start (servelab.triton.container), on this machine: the repository staged
for the server the container has, shared with the notebooks, and a restart recorded, not restaged."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest

import food11
from servelab import paths, service_exits
from servelab.service.hardware import Hardware
from servelab.triton import container as triton_container
from servelab.triton.config import TritonConfig
from servelab.triton.models import ModelRepository, model_file_places
from servelab.triton.server import ONNX_RUNNER_SOURCE, StagingError


@pytest.fixture
def shared(tmp_path, monkeypatch, built_artifacts):
    monkeypatch.setattr(triton_container, "NOTEBOOK_GROUP", os.getgid())  # the notebooks' group, in the image
    volume = triton_container.shared_paths(tmp_path / "triton")
    volume["models"].parent.mkdir()  # the volume, as Docker mounts it
    return volume


def backends(tmp_path, *names):
    folder = tmp_path / "backends"
    for name in names:
        (folder / name).mkdir(parents=True)
    return folder


def test_a_server_without_gpu_or_onnx_runtime_gets_cpu_instances_and_the_python_runner(shared, tmp_path):
    triton_container.prepare(shared, "container-a", backends(tmp_path, "python"), paths.MODELS_STAGING_DIR)
    assert Hardware.read(shared["hardware"]).backends == ("python",)
    onnx = TritonConfig.read(shared["models"] / "food_classifier_onnx" / "config.pbtxt")
    assert onnx.proto.backend == "python" and (shared["models"] / "food_classifier_onnx" / "1" / "model.py").is_file()
    assert {group.kind for group in onnx.proto.instance_group} == {onnx.proto.instance_group[0].KIND_CPU}
    model_py = (shared["models"] / "food_classifier" / "1" / "model.py").read_text()
    assert model_py == (paths.MODELS_STAGING_DIR / "food_classifier" / "1" / "model.py").read_text()  # no prelude
    assert all(os.stat(path).st_mode & 0o020 for path in shared["models"].rglob("*"))  # the notebooks may edit


def test_a_server_with_the_onnx_runtime_backend_serves_the_graph_itself(shared, tmp_path):
    triton_container.prepare(
        shared, "container-a", backends(tmp_path, "python", "onnxruntime"), paths.MODELS_STAGING_DIR
    )
    onnx = TritonConfig.read(shared["models"] / "food_classifier_onnx" / "config.pbtxt")
    assert onnx.proto.backend == "onnxruntime" and "served_by" not in onnx.proto.parameters
    assert not (shared["models"] / "food_classifier_onnx" / "1" / "model.py").exists()
    assert sorted(p.name for p in shared["models"].iterdir()) == ModelRepository().names()


def test_a_restart_of_the_same_container_keeps_what_it_served_and_is_recorded(shared, tmp_path):
    folder = backends(tmp_path, "python")
    triton_container.prepare(shared, "container-a", folder, paths.MODELS_STAGING_DIR)
    edited = shared["models"] / "food_classifier" / "config.pbtxt"
    edited.write_text(edited.read_text() + "\n# edited by a notebook\n")
    shared["log"].write_text("Signal (11) received.\n")
    triton_container.prepare(shared, "container-a", folder, paths.MODELS_STAGING_DIR)
    assert edited.read_text().endswith("# edited by a notebook\n")
    (restart,) = service_exits.read(shared["exits"])
    assert restart.service == "triton" and restart.outcome == service_exits.RESTARTING
    assert "Signal (11)" in restart.log_tail
    assert shared["log"].read_text().startswith("Signal (11) received.\n\n---- servelab: triton restarted by Docker")
    triton_container.prepare(shared, "container-b", folder, paths.MODELS_STAGING_DIR)  # after `down`: afresh
    assert not edited.read_text().endswith("# edited by a notebook\n")
    assert not shared["exits"].exists() and not shared["log"].exists()


def as_in_git(tmp_path):
    """models_staging/ as a fresh clone has it: configs and model.py files, no generated model file."""
    shipped = tmp_path / "shipped"
    generated = {place.name for _, place in model_file_places(paths.MODELS_STAGING_DIR, tmp_path)}
    shutil.copytree(
        paths.MODELS_STAGING_DIR, shipped, ignore=shutil.ignore_patterns("__pycache__", *generated, "*.json")
    )
    assert not any(path.name in generated for path in shipped.rglob("*"))
    return shipped


def built_elsewhere(tmp_path, built_artifacts, note):
    """The artifacts folder of an image: the same model files, a record of its own."""
    built = tmp_path / "image-models"
    built.mkdir()
    for model_file in (built_artifacts.pth, built_artifacts.onnx):
        shutil.copyfile(model_file, built / model_file.name)
        (built / f"{model_file.name}.weights.json").write_text(json.dumps({"weights": "untrained", "note": note}))
    return built


def test_the_image_s_model_files_are_served_whatever_the_mounted_repository_holds(shared, tmp_path, built_artifacts):
    built = built_elsewhere(tmp_path, built_artifacts, "built in the image")
    for shipped in (as_in_git(tmp_path), paths.MODELS_STAGING_DIR):  # a fresh clone; one that ran `make artifacts`
        triton_container.prepare(shared, f"container-{shipped.name}", backends(tmp_path, "python"), shipped, built)
        for source, destination in model_file_places(shared["models"], built):
            assert destination.read_bytes() == source.read_bytes(), destination
            assert food11.read_weights_info(destination)["note"] == "built in the image"
        shutil.rmtree(tmp_path / "backends")


def test_an_image_without_its_model_files_stops_the_start_saying_so(shared, tmp_path, built_artifacts):
    built = built_elsewhere(tmp_path, built_artifacts, "built in the image")
    (built / "food11.onnx").unlink()
    with pytest.raises(StagingError, match="food11.onnx is missing: this image was built without its model files"):
        triton_container.prepare(shared, "container-a", backends(tmp_path, "python"), as_in_git(tmp_path), built)


# ---- what runs in Triton's image runs on its Python --------------------------------------------

# Triton's image (24.10, docker/Dockerfile.triton) has Ubuntu 22.04's Python 3.10, which runs the
# container's start and, in the Python backend's stubs, every model.py, though the lab's package asks
# for 3.11 (for its services and load generator, which never run there).
IMAGE_PYTHON = (3, 10)
# What Python 3.11 added that a module run there must not use: (module, name), modules, builtins,
# and methods (Task.cancelling, BaseException.add_note).
NEWER_NAMES = {
    ("asyncio", "timeout"),
    ("asyncio", "TaskGroup"),
    ("asyncio", "Runner"),
    ("enum", "StrEnum"),
    ("typing", "Self"),
    ("typing", "Never"),
    ("typing", "LiteralString"),
    ("typing", "assert_never"),
    ("datetime", "UTC"),
    ("hashlib", "file_digest"),
}
NEWER_MODULES = {"tomllib", "wsgiref.types"}
NEWER_BUILTINS = {"ExceptionGroup", "BaseExceptionGroup"}
NEWER_METHODS = {"cancelling", "add_note"}


def newer_than_the_image(source: str) -> list[str]:
    """What `source` uses that the image's Python lacks, by line (its syntax is parsed as 3.10's)."""
    tree = ast.parse(source, feature_version=IMAGE_PYTHON)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used = (node.value.id, node.attr)
            if used in NEWER_NAMES or node.attr in NEWER_METHODS:
                found.append(f"line {node.lineno}: {'.'.join(used)}")
        elif isinstance(node, ast.Attribute) and node.attr in NEWER_METHODS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [
                f"line {node.lineno}: from {node.module} import {alias.name}"
                for alias in node.names
                if (node.module, alias.name) in NEWER_NAMES or node.module in NEWER_MODULES
            ]
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name in NEWER_MODULES]
        elif isinstance(node, ast.Name) and node.id in NEWER_BUILTINS:
            found.append(f"line {node.lineno}: {node.id}")
    return found


def lab_modules_run_by(roots: list[Path]) -> dict[str, Path]:
    """The lab's modules that importing `roots` runs: theirs, and each package's __init__ on the way."""
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        tree = ast.parse(todo.pop().read_text())
        for node in ast.walk(tree):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in (name for name in names if name.split(".")[0] in ("servelab", "food11")):
                parts = name.split(".")
                for depth in range(1, len(parts) + 1):
                    module = ".".join(parts[:depth])
                    base = paths.REPO_ROOT.joinpath(*parts[:depth])
                    for file in (base / "__init__.py", base.with_suffix(".py")):
                        if module not in found and file.is_file():
                            found[module] = file
                            todo.append(file)
    return found


def test_what_triton_s_image_runs_uses_nothing_newer_than_its_python():
    models = [*paths.MODELS_STAGING_DIR.glob("*/1/model.py"), ONNX_RUNNER_SOURCE]
    roots = [paths.REPO_ROOT / "servelab" / "triton" / "container.py", *models]
    modules = lab_modules_run_by(roots)
    assert {"food11", "servelab.settings", "servelab.triton.server"} <= set(modules)
    # The models import the model module and nothing else of the lab's (the start uses the package).
    assert len(models) == 4 and set(lab_modules_run_by(models)) == {"food11"}
    files = [*roots, *modules.values()]
    newer = {str(file): used for file in files if (used := newer_than_the_image(file.read_text()))}
    assert newer == {}, f"Python 3.11 only, where Triton's image runs Python 3.10: {newer}"
    # And the check sees what it looks for:
    assert newer_than_the_image("import asyncio\nasync def f():\n    async with asyncio.timeout(1):\n        pass\n")
    assert newer_than_the_image("from typing import Self\n") and newer_than_the_image("task.cancelling()\n")
    with pytest.raises(SyntaxError):
        newer_than_the_image("try:\n    pass\nexcept* ValueError:\n    pass\n")
