"""Build the model artifacts every service needs, and put them where each one expects them.

`python -m servelab artifacts` (or `make artifacts`):
1. builds `food11.pth` (a MobileNetV2 state_dict with an 11-class head) and `food11.onnx`
   (input `input` float32 [N,3,224,224], output `output` float32 [N,11], N dynamic),
2. copies them, with a `<file>.weights.json` record of where their weights came from, into the
   service folders and the Triton model versions that load them. Model files only: the code the
   services share is a package (servelab.service), installed, never copied.

Weights: a trained Food-11 checkpoint when the user supplies one (path or URL plus its SHA-256,
which is verified); otherwise a deterministic, seeded, UNTRAINED model. Serving cost is the same
either way; only the labels lose their meaning, and every service says so.

Nothing is rebuilt when the inputs (weights source, this file, library versions) are unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import tempfile
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from servelab import paths
from servelab.service.food11 import IMAGE_SIZE, LABELS, WEIGHTS_INFO_SUFFIX
from servelab.settings import settings
from servelab.triton.models import ENTRIES

log = logging.getLogger(__name__)

UNTRAINED_SEED = 0
ONNX_OPSET = 17


class ArtifactError(RuntimeError):
    """A problem the user can fix (bad checkpoint, wrong checksum, no network); the message says how."""


@dataclass(frozen=True)
class WeightsSource:
    """Where the weights come from: a user's checkpoint (path or URL) with its SHA-256, or none."""

    checkpoint: str | None = None
    sha256: str | None = None

    @classmethod
    def configured(cls) -> WeightsSource:
        """What the settings name: FOOD11_CHECKPOINT and FOOD11_CHECKPOINT_SHA256 (servelab.settings)."""
        return cls(settings().checkpoint, settings().checkpoint_sha256)

    @property
    def trained(self) -> bool:
        return self.checkpoint is not None

    def describe(self) -> str:
        return (
            f"checkpoint {self.checkpoint} (sha256 {self.sha256})"
            if self.trained
            else f"untrained, seed {UNTRAINED_SEED}"
        )


UNTRAINED_NOTE = (
    "UNTRAINED weights: a deterministic, seeded MobileNetV2 that was never trained on Food-11. "
    "Serving cost (latency, throughput) is the same as a trained model's, but the predicted labels "
    "are not meaningful. To serve a trained model, run `make artifacts "
    "FOOD11_CHECKPOINT=<path or URL> FOOD11_CHECKPOINT_SHA256=<sha256>`."
)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fetch_checkpoint(source: WeightsSource, download_dir: Path) -> Path:
    assert source.checkpoint is not None, "only a trained source has a checkpoint to fetch"
    if not source.sha256:
        raise ArtifactError(
            f"FOOD11_CHECKPOINT={source.checkpoint} was given without FOOD11_CHECKPOINT_SHA256. "
            f"Compute it with `sha256sum {source.checkpoint}` and pass it too, so a wrong file is never served."
        )
    if source.checkpoint.startswith(("http://", "https://")):
        local = download_dir / f"checkpoint-{source.sha256[:16]}.pth"
        if not local.is_file():
            download_dir.mkdir(parents=True, exist_ok=True)
            log.info("Downloading %s", source.checkpoint)
            try:
                urllib.request.urlretrieve(source.checkpoint, local.with_suffix(".part"))
            except OSError as exc:
                raise ArtifactError(
                    f"Could not download {source.checkpoint} ({exc}). On an offline machine, download it "
                    "elsewhere, copy it here and pass its path as FOOD11_CHECKPOINT instead."
                ) from exc
            local.with_suffix(".part").rename(local)
    else:
        local = Path(source.checkpoint).expanduser()
        if not local.is_file():
            raise ArtifactError(f"FOOD11_CHECKPOINT={source.checkpoint} is not a file.")
    actual = sha256_of(local)
    if actual != source.sha256.lower():
        raise ArtifactError(
            f"Checksum mismatch for {source.checkpoint}: expected {source.sha256}, got {actual}. "
            "The file is not the one you meant; nothing was built."
        )
    return local


def _load_checkpoint_state_dict(path: Path) -> dict:
    import torch

    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        # A whole pickled model, as the original lab's food11.pth was. Unpickling runs code from
        # the file, which is acceptable only because its checksum was verified just before.
        loaded = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(loaded, torch.nn.Module):
        loaded = loaded.state_dict()
    for key in ("state_dict", "model_state_dict"):
        if isinstance(loaded, dict) and key in loaded:
            loaded = loaded[key]
    if not isinstance(loaded, dict):
        raise ArtifactError(f"{path} holds a {type(loaded).__name__}, not a MobileNetV2 state_dict or model.")
    return loaded


def build_model(source: WeightsSource, download_dir: Path):
    """A MobileNetV2 with an 11-class head, in eval mode, with the weights `source` names."""
    import torch
    from torchvision.models import mobilenet_v2

    torch.manual_seed(UNTRAINED_SEED)
    model = mobilenet_v2(num_classes=len(LABELS))
    if source.trained:
        state_dict = _load_checkpoint_state_dict(_fetch_checkpoint(source, download_dir))
        try:
            model.load_state_dict(state_dict)
        except RuntimeError as exc:
            raise ArtifactError(
                f"{source.checkpoint} does not fit torchvision's mobilenet_v2(num_classes={len(LABELS)}): {exc}"
            ) from exc
    else:
        _calibrate_batchnorm(model)
    return model.eval()


def _calibrate_batchnorm(model) -> None:
    """Give the untrained model BatchNorm statistics from seeded synthetic images.

    Freshly initialised MobileNetV2 outputs almost the same logits for every input, which would
    make every prediction identical and every PyTorch/ONNX comparison trivially true. Estimating
    the BatchNorm running statistics on noise (no labels, no training) makes the outputs depend on
    the image, so the services' answers can actually be compared.
    """
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.reset_running_stats()
            module.momentum = None  # cumulative average over all calibration batches
    generator = torch.Generator().manual_seed(UNTRAINED_SEED + 1)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(16, 3, IMAGE_SIZE, IMAGE_SIZE, generator=generator))
    model.eval()


def export_onnx(model, onnx_path: Path) -> None:
    import torch

    example = torch.randn(4, 3, IMAGE_SIZE, IMAGE_SIZE, generator=torch.Generator().manual_seed(2))
    with warnings.catch_warnings():
        # The TorchScript-based exporter is used on purpose: it needs no extra packages and marks
        # the batch dimension dynamic directly. Its deprecation notice is not the student's concern.
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            model,
            (example,),
            str(onnx_path),
            input_names=["input"],
            output_names=["output"],
            dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
            opset_version=ONNX_OPSET,
            dynamo=False,
        )


def _fingerprint(source: WeightsSource) -> str:
    """Everything that, if changed, makes the built files stale."""
    import torch
    import torchvision

    parts = [
        Path(__file__).read_bytes(),
        source.describe().encode(),
        f"torch {torch.__version__} torchvision {torchvision.__version__}".encode(),
    ]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


@dataclass(frozen=True)
class BuiltArtifacts:
    pth: Path
    onnx: Path
    weights_info: dict


def build_artifacts(out_dir: Path, source: WeightsSource, force: bool = False) -> BuiltArtifacts:
    """Build food11.pth and food11.onnx in out_dir, unless they are already there and current."""
    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    pth, onnx, manifest = out_dir / "food11.pth", out_dir / "food11.onnx", out_dir / "manifest.json"
    fingerprint = _fingerprint(source)
    if not force and pth.is_file() and onnx.is_file() and manifest.is_file():
        recorded = json.loads(manifest.read_text())
        if recorded.get("fingerprint") == fingerprint:
            log.info("Artifacts are current (%s); nothing to build.", source.describe())
            return BuiltArtifacts(pth, onnx, recorded["weights_info"])

    log.info("Building food11.pth and food11.onnx (%s)...", source.describe())
    model = build_model(source, out_dir / "downloads")
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        # Written to a temporary folder and moved into place, so an interrupted build never
        # leaves a half-written model that looks current.
        tmp_pth, tmp_onnx = Path(tmp) / pth.name, Path(tmp) / onnx.name
        torch.save(model.state_dict(), tmp_pth)
        export_onnx(model, tmp_onnx)
        tmp_pth.replace(pth)
        tmp_onnx.replace(onnx)
    weights_info = {
        "weights": "trained" if source.trained else "untrained",
        "note": f"Trained Food-11 weights from {source.checkpoint}." if source.trained else UNTRAINED_NOTE,
        "source": source.describe(),
    }
    manifest.write_text(json.dumps({"fingerprint": fingerprint, "weights_info": weights_info}, indent=2))
    return BuiltArtifacts(pth, onnx, weights_info)


def placements(built: BuiltArtifacts) -> list[tuple[Path, Path]]:
    """(source, destination) for every model file a service or Triton model loads."""
    pairs = [
        (built.pth, paths.FASTAPI_PT_DIR / "food11.pth"),
        (built.onnx, paths.FASTAPI_ONNX_DIR / "food11.onnx"),
        (built.onnx, paths.RAY_SERVE_DIR / "food11.onnx"),
    ]
    # Each Triton model's generated files, as its registry entry lists them, in its version 1.
    generated = {"pytorch weights": built.pth, "onnx graph": built.onnx}
    for name, entry in ENTRIES.items():
        for file_name, kind in entry.artifacts.items():
            if kind not in generated:
                raise ArtifactError(
                    f"servelab/triton/models.py: {name}'s artifact {file_name} is a {kind!r}; "
                    f"`make artifacts` builds: {', '.join(generated)}."
                )
            pairs.append((generated[kind], paths.MODELS_STAGING_DIR / name / "1" / file_name))
    return pairs


def _copy_if_changed(source: Path, destination: Path) -> bool:
    if destination.is_file() and destination.read_bytes() == source.read_bytes():
        return False
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)
    return True


def place_artifacts(built: BuiltArtifacts) -> list[Path]:
    """Copy every generated file where it belongs; returns the destinations that changed."""
    changed = []
    for source, destination in placements(built):
        if _copy_if_changed(source, destination):
            changed.append(destination)
        if source in (built.pth, built.onnx):
            info = dict(built.weights_info, model_file_sha256=sha256_of(destination))
            info_path = Path(str(destination) + WEIGHTS_INFO_SUFFIX)
            text = json.dumps(info, indent=2) + "\n"
            if not info_path.is_file() or info_path.read_text() != text:
                info_path.write_text(text)
                changed.append(info_path)
    return changed


def ensure_artifacts(source: WeightsSource | None = None, force: bool = False) -> BuiltArtifacts:
    source = source or WeightsSource.configured()
    built = build_artifacts(paths.ARTIFACTS_DIR, source, force=force)
    changed = place_artifacts(built)
    for destination in changed:
        log.info("placed %s", destination.relative_to(paths.REPO_ROOT))
    if built.weights_info["weights"] != "trained":
        banner = "!" * 100
        log.warning("\n%s\n%s\n%s", banner, built.weights_info["note"], banner)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab artifacts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="trained Food-11 checkpoint: path or URL (default: $FOOD11_CHECKPOINT)")
    parser.add_argument("--sha256", help="its SHA-256 (default: $FOOD11_CHECKPOINT_SHA256)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the artifacts are current")
    args = parser.parse_args(argv)
    env = WeightsSource.configured()
    source = WeightsSource(args.checkpoint or env.checkpoint, args.sha256 or env.sha256)
    try:
        ensure_artifacts(source, force=args.force)
    except ArtifactError as exc:
        log.error("%s", exc)
        return 2
    return 0
