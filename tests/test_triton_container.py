"""The Triton container's start (servelab.triton.container), on this machine: the repository staged
for the server the container has, shared with the notebooks, and a restart recorded, not restaged."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from servelab import paths, service_exits
from servelab.service import food11
from servelab.service.hardware import Hardware
from servelab.triton import container as triton_container
from servelab.triton.config import TritonConfig
from servelab.triton.models import ModelRepository, model_file_places
from servelab.triton.server import StagingError


@pytest.fixture
def shared(tmp_path, monkeypatch, built_artifacts):
    monkeypatch.setattr(triton_container, "NOTEBOOK_GROUP", os.getgid())  # the notebooks' group, in the image
    return triton_container.shared_paths(tmp_path / "triton")


def backends(tmp_path, *names):
    folder = tmp_path / "backends"
    for name in names:
        (folder / name).mkdir(parents=True)
    return folder


def test_a_server_without_gpu_or_onnx_runtime_gets_cpu_instances_and_the_python_runner(shared, tmp_path):
    shared["models"].parent.mkdir()
    triton_container.prepare(shared, "container-a", backends(tmp_path, "python"), paths.MODELS_STAGING_DIR)
    assert Hardware.read(shared["hardware"]).backends == ("python",)
    onnx = TritonConfig.read(shared["models"] / "food_classifier_onnx" / "config.pbtxt")
    assert onnx.proto.backend == "python" and (shared["models"] / "food_classifier_onnx" / "1" / "model.py").is_file()
    assert {group.kind for group in onnx.proto.instance_group} == {onnx.proto.instance_group[0].KIND_CPU}
    model_py = (shared["models"] / "food_classifier" / "1" / "model.py").read_text()
    assert model_py == (paths.MODELS_STAGING_DIR / "food_classifier" / "1" / "model.py").read_text()  # no prelude
    assert all(os.stat(path).st_mode & 0o020 for path in shared["models"].rglob("*"))  # the notebooks may edit


def test_a_server_with_the_onnx_runtime_backend_serves_the_graph_itself(shared, tmp_path):
    shared["models"].parent.mkdir()
    triton_container.prepare(
        shared, "container-a", backends(tmp_path, "python", "onnxruntime"), paths.MODELS_STAGING_DIR
    )
    onnx = TritonConfig.read(shared["models"] / "food_classifier_onnx" / "config.pbtxt")
    assert onnx.proto.backend == "onnxruntime" and "served_by" not in onnx.proto.parameters
    assert not (shared["models"] / "food_classifier_onnx" / "1" / "model.py").exists()
    assert sorted(p.name for p in shared["models"].iterdir()) == ModelRepository().names()


def test_a_restart_of_the_same_container_keeps_what_it_served_and_is_recorded(shared, tmp_path):
    shared["models"].parent.mkdir()
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
    shared["models"].parent.mkdir()
    built = built_elsewhere(tmp_path, built_artifacts, "built in the image")
    for shipped in (as_in_git(tmp_path), paths.MODELS_STAGING_DIR):  # a fresh clone; one that ran `make artifacts`
        triton_container.prepare(shared, f"container-{shipped.name}", backends(tmp_path, "python"), shipped, built)
        for source, destination in model_file_places(shared["models"], built):
            assert destination.read_bytes() == source.read_bytes(), destination
            assert food11.read_weights_info(destination)["note"] == "built in the image"
        shutil.rmtree(tmp_path / "backends")


def test_an_image_without_its_model_files_stops_the_start_saying_so(shared, tmp_path, built_artifacts):
    shared["models"].parent.mkdir()
    built = built_elsewhere(tmp_path, built_artifacts, "built in the image")
    (built / "food11.onnx").unlink()
    with pytest.raises(StagingError, match="food11.onnx is missing: this image was built without its model files"):
        triton_container.prepare(shared, "container-a", backends(tmp_path, "python"), as_in_git(tmp_path), built)
