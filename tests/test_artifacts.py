"""Model artifacts: ONNX/PyTorch agreement, placement and staleness (trained checkpoints: test_weights.py)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torchvision.models import mobilenet_v2

import food11
from servelab import paths
from servelab.stack import artifacts
from tests.helpers import make_image_bytes


@pytest.fixture(scope="module")
def image_batch() -> np.ndarray:
    images = [food11.decode_image_bytes(make_image_bytes(seed)) for seed in range(6)]
    return np.stack([food11.preprocess(image) for image in images])


def _pytorch_logits(pth, batch):
    model = mobilenet_v2(num_classes=11)
    model.load_state_dict(torch.load(pth, weights_only=True))
    with torch.inference_mode():
        return model.eval()(torch.from_numpy(batch)).numpy()


def test_onnx_export_agrees_with_pytorch_on_a_batch_of_real_images(built_artifacts, image_batch):
    reference = _pytorch_logits(built_artifacts.pth, image_batch)
    session = ort.InferenceSession(str(built_artifacts.onnx), providers=["CPUExecutionProvider"])
    exported = session.run(["output"], {"input": image_batch})[0]
    assert exported.shape == (6, 11)
    assert np.abs(exported - reference).max() < 1e-4
    assert [label for label, _ in food11.top_prediction(exported)] == [
        label for label, _ in food11.top_prediction(reference)
    ]


def test_untrained_model_output_depends_on_the_image(built_artifacts, image_batch):
    # Without BatchNorm calibration every image would get the same logits, and every agreement
    # check above would pass trivially.
    logits = _pytorch_logits(built_artifacts.pth, image_batch)
    assert logits.std(axis=0).mean() > 1e-3


def test_onnx_signature_has_a_dynamic_batch_dimension(built_artifacts):
    session = ort.InferenceSession(str(built_artifacts.onnx), providers=["CPUExecutionProvider"])
    (model_input,), (model_output,) = session.get_inputs(), session.get_outputs()
    assert (model_input.name, model_input.type) == ("input", "tensor(float)")
    assert (model_output.name, model_output.type) == ("output", "tensor(float)")
    assert model_input.shape[1:] == [3, 224, 224] and isinstance(model_input.shape[0], str)
    for batch in (1, 5):
        assert session.run(None, {"input": np.zeros((batch, 3, 224, 224), np.float32)})[0].shape == (batch, 11)


def test_every_placed_copy_matches_its_source_and_has_a_weights_record(built_artifacts):
    for source, destination in artifacts.placements(built_artifacts):
        assert destination.read_bytes() == source.read_bytes(), f"{destination} is stale"
        if destination.suffix in (".pth", ".onnx"):
            info = food11.read_weights_info(destination)
            assert info["weights"] == built_artifacts.weights_info["weights"]
            assert info["model_file_sha256"] == hashlib.sha256(destination.read_bytes()).hexdigest()


def test_untrained_weights_are_declared_as_such(built_artifacts):
    if artifacts.WeightsSource.configured().trained:
        pytest.skip("this run serves a user-supplied checkpoint (FOOD11_CHECKPOINT is set)")
    assert built_artifacts.weights_info["weights"] == "untrained"
    assert "not meaningful" in built_artifacts.weights_info["note"]


@pytest.mark.integration
def test_a_second_build_with_the_same_inputs_does_nothing(tmp_path):
    source = artifacts.WeightsSource()
    first = artifacts.build_artifacts(tmp_path, source)
    mtimes = (first.pth.stat().st_mtime_ns, first.onnx.stat().st_mtime_ns)
    second = artifacts.build_artifacts(tmp_path, source)
    assert (second.pth.stat().st_mtime_ns, second.onnx.stat().st_mtime_ns) == mtimes


def test_shared_logic_is_defined_once():
    # Labels and preprocessing live in food11.py; every other source, tracked or
    # not yet (only generated model files are git-ignored), imports them: no folder holds a copy.
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    sources = [paths.REPO_ROOT / name for name in listed if not name.startswith("tests/")]
    defining = sorted(p.relative_to(paths.REPO_ROOT).as_posix() for p in sources if '"Dairy product"' in p.read_text())
    assert defining == ["food11.py"]


def test_make_artifacts_places_model_files_only():
    """Model files only: a service's code is its own folder's (and food11.py, which each image copies)."""
    placed = artifacts.placements(artifacts.BuiltArtifacts(Path("food11.pth"), Path("food11.onnx"), {}))
    assert {destination.suffix for _, destination in placed} == {".pth", ".onnx"}


# What the lab's PyTorch image builds its model files with (docker/Dockerfile.torch): no Triton client,
# no other tool of the lab's. Importing one of these is what this build must never need.
NOT_IN_THE_TORCH_IMAGE = ("tritonclient", "grpc", "ray", "fastapi", "httpx", "aiohttp", "jupytext", "nbclient")
BLOCKED_IMPORTS = """
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not in the torch image)")
sys.meta_path.insert(0, NotInstalled())
import runpy
sys.argv = ["artifacts", "--build-only"]
runpy.run_module("servelab.stack.artifacts", run_name="__main__")
"""


@pytest.mark.integration
def test_the_build_only_step_of_the_torch_image_needs_no_triton_client_and_places_nothing(tmp_path):
    env = {**os.environ, "SERVELAB_DIR": str(tmp_path / "lab"), "SERVELAB_ARTIFACTS_DIR": str(tmp_path / "models")}
    env.pop("FOOD11_CHECKPOINT", None)
    script = BLOCKED_IMPORTS.format(blocked=NOT_IN_THE_TORCH_IMAGE)
    before = {path: path.stat().st_mtime_ns for path in (paths.FASTAPI_PT_DIR / "food11.pth",) if path.exists()}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in ("food11.pth", "food11.onnx"):
        model_file = tmp_path / "models" / name
        assert food11.read_weights_info(model_file)["model_file_sha256"] == artifacts.sha256_of(model_file)
    assert {path: path.stat().st_mtime_ns for path in before} == before, "it placed files in the clone"


def test_a_machine_brought_only_some_artifacts_places_those_and_says_which_it_lacks(
    built_artifacts, tmp_path, monkeypatch, caplog
):
    """`--place-only` (a bare GPU machine: scripts/gpu_check_there.sh) places what was brought, as built
    elsewhere, and builds nothing; its manifest is what it reads the weights from."""
    brought = tmp_path / "artifacts"
    brought.mkdir()
    (brought / "food11.pth").write_bytes(built_artifacts.pth.read_bytes())
    monkeypatch.setattr(paths, "ARTIFACTS_DIR", brought)
    assert artifacts.main(["--place-only"]) == 2, "no manifest: nothing to say what the weights are"
    (brought / "manifest.json").write_text(json.dumps({"weights_info": built_artifacts.weights_info}))
    with caplog.at_level("WARNING"):
        assert artifacts.main(["--place-only"]) == 0
    assert "food11.onnx is not here: fastapi_onnx/food11.onnx is not placed" in caplog.text
    assert not list(brought.glob("*.onnx")), "nothing was built"
    onnx_less = artifacts.BuiltArtifacts(brought / "food11.pth", brought / "food11.onnx", built_artifacts.weights_info)
    with pytest.raises(FileNotFoundError):
        artifacts.place_artifacts(onnx_less)  # in a set-up lab, a missing artifact is an error
