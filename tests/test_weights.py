"""Trained weights (servelab.stack.weights): a checkpoint is fetched, its digest checked before
anything unpickles it, its architecture checked, and the model files built from it."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from torchvision.models import mobilenet_v2

from servelab import paths
from servelab.stack import artifacts, weights


def save_model(path, num_classes: int = 11, whole: bool = True):
    """A seeded MobileNetV2 saved at `path`, whole (pickled) or as {"state_dict": ...}; the model."""
    torch.manual_seed(123)
    model = mobilenet_v2(num_classes=num_classes).eval()
    torch.save(model if whole else {"state_dict": model.state_dict()}, path)
    return model


class MakesADirectoryWhenUnpickled:
    """Unpickling this runs os.mkdir(mark): the mark says whether anything unpickled the file."""

    def __init__(self, mark) -> None:
        self.mark = str(mark)

    def __reduce__(self):
        return os.mkdir, (self.mark,)


@pytest.fixture
def file_server(tmp_path):
    """An HTTP server on 127.0.0.1 serving the files of tmp_path/served; its URL."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(served))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("content", [b"", b"food11\n", bytes(range(256)) * 5000], ids=["empty", "text", "binary"])
def test_the_git_blob_id_is_what_git_hash_object_prints(tmp_path, content):
    path = tmp_path / "file"
    path.write_bytes(content)
    printed = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout
    assert weights.git_blob_id(path) == printed.strip()


def test_original_names_the_original_labs_file_at_its_commit_by_its_blob_id():
    source = weights.WeightsSource("original")
    assert source.checkpoint == (
        "https://raw.githubusercontent.com/teaching-on-testbeds/serve-system-chi/"
        "012a8b946b432f62e120d315ae974c54c303e9da/fastapi_pt/food11.pth"
    )
    assert source.digest() == ("git blob", "b550214474f469ca65c2eb6c30f383ef4e7e8c7a")
    assert source.trained and "the original lab's trained weights" in source.describe()


def test_a_source_the_settings_would_refuse_is_refused_as_an_artifact_error():
    """The rules (exactly one digest, none for `original`) are the settings' (tests/test_settings.py)."""
    with pytest.raises(weights.ArtifactError, match="two digests"):
        weights.WeightsSource("/x/food11.pth", "a" * 64, "b" * 40)


@pytest.mark.integration  # builds and exports a MobileNetV2
def test_a_whole_pickled_mobilenet_is_downloaded_checked_by_its_blob_id_and_built(tmp_path, file_server):
    model = save_model(tmp_path / "served" / "food11.pth")
    url = f"{file_server}/food11.pth"
    source = weights.WeightsSource(url, git_blob=weights.git_blob_id(tmp_path / "served" / "food11.pth"))
    built = artifacts.build_artifacts(tmp_path / "out", source)
    saved = torch.load(built.pth, weights_only=True)
    expected = model.state_dict()
    assert saved.keys() == expected.keys()
    assert all(torch.equal(saved[key], value) for key, value in expected.items())
    assert built.weights_info["weights"] == "trained" and url in built.weights_info["source"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["weights_info"] == built.weights_info


@pytest.mark.integration  # builds and exports a MobileNetV2
def test_a_state_dict_checkpoint_on_disk_is_checked_by_its_sha256_and_built(tmp_path):
    model = save_model(tmp_path / "state.pth", whole=False)
    source = weights.WeightsSource(
        str(tmp_path / "state.pth"), hashlib.sha256((tmp_path / "state.pth").read_bytes()).hexdigest()
    )
    built = artifacts.build_artifacts(tmp_path / "out", source)
    saved = torch.load(built.pth, weights_only=True)
    assert all(torch.equal(saved[key], value) for key, value in model.state_dict().items())
    assert built.weights_info["weights"] == "trained"


def test_a_file_whose_digest_does_not_match_is_refused_before_anything_unpickles_it(tmp_path, file_server):
    mark = tmp_path / "unpickled"
    bait = tmp_path / "served" / "food11.pth"
    torch.save(MakesADirectoryWhenUnpickled(mark), bait)
    wrong = "0" * 40
    for checkpoint in (str(bait), f"{file_server}/food11.pth"):
        with pytest.raises(weights.ArtifactError, match=f"Checksum mismatch.*expected git blob {wrong}"):
            artifacts.build_artifacts(tmp_path / "out", weights.WeightsSource(checkpoint, git_blob=wrong))
        assert not mark.exists(), f"{checkpoint} was unpickled although its digest did not match"
    assert list((tmp_path / "out" / "downloads").iterdir()) == [], "a download that did not match was kept"
    assert not (tmp_path / "out" / "food11.pth").exists()
    # The control: with its own digest, the same file is unpickled (and refused for what it holds),
    # so the mark does see an unpickling.
    with pytest.raises(weights.ArtifactError, match="holds a NoneType"):
        weights.trained_model(weights.WeightsSource(str(bait), git_blob=weights.git_blob_id(bait)), tmp_path)
    assert mark.is_dir()


def test_a_whole_pickled_mobilenet_with_ten_classes_is_refused_naming_what_it_has(tmp_path):
    save_model(tmp_path / "ten.pth", num_classes=10)
    source = weights.WeightsSource(str(tmp_path / "ten.pth"), git_blob=weights.git_blob_id(tmp_path / "ten.pth"))
    with pytest.raises(weights.ArtifactError, match="a whole pickled MobileNetV2 whose classifier has 10 outputs"):
        weights.trained_model(source, tmp_path)


def test_a_whole_pickled_model_that_is_not_a_mobilenet_is_refused_naming_its_class(tmp_path):
    torch.save(torch.nn.Sequential(torch.nn.Linear(2, 11)), tmp_path / "other.pth")
    source = weights.WeightsSource(str(tmp_path / "other.pth"), git_blob=weights.git_blob_id(tmp_path / "other.pth"))
    with pytest.raises(weights.ArtifactError, match="a whole pickled Sequential, not a MobileNetV2"):
        weights.trained_model(source, tmp_path)


def test_an_unreachable_checkpoint_url_says_what_to_do_offline(tmp_path):
    source = weights.WeightsSource("http://127.0.0.1:9/food11.pth", git_blob="b" * 40)
    with pytest.raises(
        weights.ArtifactError, match=f"offline.*FOOD11_CHECKPOINT=<its path> FOOD11_CHECKPOINT_GIT_BLOB={'b' * 40}"
    ):
        weights.trained_model(source, tmp_path)
    assert list(tmp_path.iterdir()) == [], "a failed download left a file behind"


def test_the_command_line_and_the_environment_both_name_the_checkpoint(tmp_path, caplog):
    missing = tmp_path / "missing.pth"
    assert artifacts.main(["--checkpoint", str(missing), "--git-blob", "c" * 40]) == 2
    assert f"FOOD11_CHECKPOINT={missing} is not a file" in caplog.text
    env = {
        "PATH": "/usr/bin:/bin",
        "SERVELAB_DIR": str(tmp_path / "lab"),
        "FOOD11_CHECKPOINT": str(missing),
        "FOOD11_CHECKPOINT_GIT_BLOB": "c" * 40,
    }
    ran = subprocess.run(
        [sys.executable, "-m", "servelab", "artifacts"], env=env, cwd=paths.REPO_ROOT, capture_output=True, text=True
    )
    assert ran.returncode == 2 and f"FOOD11_CHECKPOINT={missing} is not a file" in ran.stderr
    shown = subprocess.run(
        [
            sys.executable,
            "-c",
            "from servelab.stack import weights; print(weights.WeightsSource.configured().describe())",
        ],
        env={"PATH": "/usr/bin:/bin", "FOOD11_CHECKPOINT": "original"},
        cwd=paths.REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert weights.ORIGINAL_URL in shown and weights.ORIGINAL_GIT_BLOB in shown
