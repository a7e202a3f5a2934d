"""Model artifacts: ONNX/PyTorch agreement, placement, staleness and the checkpoint path."""

import hashlib
import json
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torchvision.models import mobilenet_v2

from servelab import paths
from servelab.service import food11
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


def _checkpoint(tmp_path, whole_module: bool):
    torch.manual_seed(123)
    model = mobilenet_v2(num_classes=11).eval()
    path = tmp_path / ("module.pth" if whole_module else "state.pth")
    torch.save(model if whole_module else {"state_dict": model.state_dict()}, path)
    return model, path, hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
@pytest.mark.parametrize("whole_module", [False, True], ids=["state_dict", "pickled_module"])
def test_a_supplied_checkpoint_with_the_right_checksum_is_used_and_marked_trained(tmp_path, whole_module):
    model, path, sha = _checkpoint(tmp_path, whole_module)
    built = artifacts.build_artifacts(tmp_path / "out", artifacts.WeightsSource(str(path), sha))
    assert built.weights_info["weights"] == "trained"
    saved = torch.load(built.pth, weights_only=True)
    assert all(torch.equal(saved[key], value) for key, value in model.state_dict().items())
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["weights_info"]["weights"] == "trained"


def test_a_checkpoint_with_the_wrong_checksum_is_refused(tmp_path):
    _, path, _ = _checkpoint(tmp_path, whole_module=False)
    with pytest.raises(artifacts.ArtifactError, match="Checksum mismatch"):
        artifacts.build_artifacts(tmp_path / "out", artifacts.WeightsSource(str(path), "0" * 64))
    assert not (tmp_path / "out" / "food11.pth").exists()


def test_a_checkpoint_without_a_checksum_is_refused(tmp_path):
    _, path, _ = _checkpoint(tmp_path, whole_module=False)
    with pytest.raises(artifacts.ArtifactError, match="FOOD11_CHECKPOINT_SHA256"):
        artifacts.build_artifacts(tmp_path / "out", artifacts.WeightsSource(str(path), None))


def test_an_unreachable_checkpoint_url_fails_with_an_offline_hint(tmp_path):
    source = artifacts.WeightsSource("http://127.0.0.1:9/food11.pth", "0" * 64)
    with pytest.raises(artifacts.ArtifactError, match="offline"):
        artifacts.build_artifacts(tmp_path / "out", source)


def test_shared_logic_is_defined_once():
    # Labels and preprocessing live in servelab/service/food11.py; every other source, tracked or
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
    assert defining == ["servelab/service/food11.py"]


def test_make_artifacts_places_model_files_only():
    """The services' code is the installed servelab.service package: nothing else is placed."""
    placed = artifacts.placements(artifacts.BuiltArtifacts(Path("food11.pth"), Path("food11.onnx"), {}))
    assert {destination.suffix for _, destination in placed} == {".pth", ".onnx"}
