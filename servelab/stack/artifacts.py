"""Build the model artifacts every service needs, and put them where each one expects them.

`python -m servelab artifacts` (or `make artifacts`):
1. builds `food11.pth` (a MobileNetV2 state_dict with an 11-class head) and `food11.onnx`
   (input `input` float32 [N,3,224,224], output `output` float32 [N,11], N dynamic) in the
   artifacts folder (SERVELAB_ARTIFACTS_DIR), each with a `<file>.weights.json` record of where its
   weights came from,
2. copies them, with their records, into the service folders and the Triton model versions that
   load them (Ray Serve's replicas serve fastapi_onnx's app, and its model file). Model files only.

`--build-only` does step 1 alone: the lab's PyTorch image builds its model files so
(docker/Dockerfile.torch), with no Triton client installed to read the model registry.

Weights: a trained Food-11 checkpoint when the settings name one (servelab.stack.weights fetches
it, checks its digest before reading it, and checks its architecture; `original` is the original
lab's); otherwise a deterministic, seeded, UNTRAINED model. Serving cost is the same either way;
only the labels lose their meaning, and every service says so.

Nothing is rebuilt when the inputs (weights source, this file and weights.py, library versions) are
unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

from food11 import IMAGE_SIZE, LABELS, WEIGHTS_INFO_SUFFIX
from servelab import paths
from servelab.stack import weights
from servelab.stack.weights import UNTRAINED_SEED, ArtifactError, WeightsSource, sha256_of

log = logging.getLogger(__name__)

ONNX_OPSET = 17

UNTRAINED_NOTE = (
    "UNTRAINED weights: a deterministic, seeded MobileNetV2 that was never trained on Food-11. "
    "Serving cost (latency, throughput) is the same as a trained model's, but the predicted labels "
    "are not meaningful. To serve the original lab's trained model, run `make artifacts "
    "FOOD11_CHECKPOINT=original` on a machine with internet access; for another checkpoint, "
    "`make artifacts FOOD11_CHECKPOINT=<path or URL> FOOD11_CHECKPOINT_SHA256=<sha256>`."
)


def build_model(source: WeightsSource, download_dir: Path):
    """A MobileNetV2 with an 11-class head, in eval mode, with the weights `source` names."""
    import torch
    from torchvision.models import mobilenet_v2

    if source.trained:
        return weights.trained_model(source, download_dir).eval()
    torch.manual_seed(UNTRAINED_SEED)
    model = mobilenet_v2(num_classes=len(LABELS))
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
        Path(weights.__file__).read_bytes(),
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
            for model_file in (pth, onnx):
                write_weights_record(model_file, recorded["weights_info"])
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
        "note": f"Trained Food-11 weights: {source.describe()}." if source.trained else UNTRAINED_NOTE,
        "source": source.describe(),
    }
    for model_file in (pth, onnx):
        write_weights_record(model_file, weights_info)
    manifest.write_text(json.dumps({"fingerprint": fingerprint, "weights_info": weights_info}, indent=2))
    return BuiltArtifacts(pth, onnx, weights_info)


def write_weights_record(model_file: Path, weights_info: dict) -> bool:
    """Write `<model_file>.weights.json` (what a service reports of its weights), unless it says
    that already; returns whether it was written."""
    info = dict(weights_info, model_file_sha256=sha256_of(model_file))
    record = Path(str(model_file) + WEIGHTS_INFO_SUFFIX)
    text = json.dumps(info, indent=2) + "\n"
    if record.is_file() and record.read_text() == text:
        return False
    record.write_text(text)
    return True


def placements(built: BuiltArtifacts) -> list[tuple[Path, Path]]:
    """(source, destination) for every model file a service or Triton model loads."""
    # The registry reads the models' configs with the Triton client's schema: imported here, so that
    # building alone (--build-only) needs no Triton client.
    from servelab.triton.models import model_file_places

    assert built.pth.parent == built.onnx.parent, "built in one artifacts folder"
    return [
        (built.pth, paths.FASTAPI_PT_DIR / "food11.pth"),
        (built.onnx, paths.FASTAPI_ONNX_DIR / "food11.onnx"),
        # Each Triton model's generated files, as its registry entry lists them, in its version 1.
        *model_file_places(paths.MODELS_STAGING_DIR, built.pth.parent),
    ]


def _copy_if_changed(source: Path, destination: Path) -> bool:
    if destination.is_file() and destination.read_bytes() == source.read_bytes():
        return False
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, destination)
    return True


def place_artifacts(built: BuiltArtifacts, missing_ok: bool = False) -> list[Path]:
    """Copy every generated file where it belongs (with `missing_ok`, those that are there: a machine
    that was brought only some); returns the destinations that changed."""
    changed = []
    for source, destination in placements(built):
        if missing_ok and not source.is_file():
            log.warning("%s is not here: %s is not placed", source.name, destination.relative_to(paths.REPO_ROOT))
            continue
        if _copy_if_changed(source, destination):
            changed.append(destination)
        if source in (built.pth, built.onnx) and write_weights_record(destination, built.weights_info):
            changed.append(Path(str(destination) + WEIGHTS_INFO_SUFFIX))
    return changed


def ensure_artifacts(source: WeightsSource | None = None, force: bool = False, place: bool = True) -> BuiltArtifacts:
    source = source or WeightsSource.configured()
    built = build_artifacts(paths.ARTIFACTS_DIR, source, force=force)
    changed = place_artifacts(built) if place else []
    for destination in changed:
        log.info("placed %s", destination.relative_to(paths.REPO_ROOT))
    if built.weights_info["weights"] != "trained":
        banner = "!" * 100
        log.warning("\n%s\n%s\n%s", banner, built.weights_info["note"], banner)
    return built


def place_built() -> int:
    """Place what the artifacts folder holds (all or some of it), as its manifest describes it, whatever built it."""
    folder = paths.ARTIFACTS_DIR
    try:
        weights_info = json.loads((folder / "manifest.json").read_text())["weights_info"]
    except (OSError, ValueError, KeyError) as exc:
        log.error("%s has no readable manifest.json (%s): run `make artifacts` where the lab is set up", folder, exc)
        return 2
    built = BuiltArtifacts(folder / "food11.pth", folder / "food11.onnx", weights_info)
    for destination in place_artifacts(built, missing_ok=True):
        log.info("placed %s", destination.relative_to(paths.REPO_ROOT))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servelab artifacts", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--checkpoint",
        help="trained Food-11 checkpoint: a path, a URL, or `original` (the original lab's); with --sha256 or "
        "--git-blob, these three replace FOOD11_CHECKPOINT and its digests (default: those variables)",
    )
    parser.add_argument("--sha256", help="the checkpoint's SHA-256")
    parser.add_argument("--git-blob", help="the checkpoint's git blob id (`git hash-object FILE`)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the artifacts are current")
    parser.add_argument(
        "--build-only", action="store_true", help="build in the artifacts folder, place nothing (the Docker build)"
    )
    parser.add_argument(
        "--place-only",
        action="store_true",
        help="place the artifacts folder's files as built elsewhere, build nothing (a bare GPU machine: make test-gpu)",
    )
    args = parser.parse_args(argv)
    if args.place_only:
        return place_built()
    try:
        # Given together, so that a digest from the environment never checks a file named here.
        named_here = args.checkpoint or args.sha256 or args.git_blob
        source = (
            WeightsSource(args.checkpoint, args.sha256, args.git_blob) if named_here else WeightsSource.configured()
        )
        ensure_artifacts(source, force=args.force, place=not args.build_only)
    except ArtifactError as exc:
        log.error("%s", exc)
        return 2
    return 0


if __name__ == "__main__":
    # `python -m servelab.stack.artifacts`, as the lab's PyTorch image runs it: the command line of
    # `python -m servelab artifacts` without the rest of the tooling's imports.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
