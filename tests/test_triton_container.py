"""The Triton container's start (servelab.triton.container), on this machine: the repository staged
for the server the container has, shared with the notebooks, and a restart recorded, not restaged."""

from __future__ import annotations

import os

import pytest

from servelab import paths, service_exits
from servelab.service.hardware import Hardware
from servelab.triton import container as triton_container
from servelab.triton.config import TritonConfig
from servelab.triton.models import ModelRepository


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
