"""Where the served weights come from: a trained checkpoint, fetched, verified, then read.

A checkpoint is named by FOOD11_CHECKPOINT (servelab.settings) with one digest of its bytes:
FOOD11_CHECKPOINT_SHA256 (`sha256sum FILE`), or FOOD11_CHECKPOINT_GIT_BLOB (`git hash-object FILE`,
the id a repository's tree lists for the file). `FOOD11_CHECKPOINT=original` names the original
lab's trained food11.pth: its raw URL at a fixed commit, and its git blob id. With no checkpoint,
the lab builds untrained weights (servelab.stack.artifacts) and says so everywhere.

The file's digest is checked before anything unpickles it; a download that does not match is
deleted. Then its state_dict is taken out (of a state_dict, a {"state_dict": ...} checkpoint, or a
whole pickled model as the original lab's is) and checked against torchvision's MobileNetV2 with
Food-11's 11 outputs. Needs torch and torchvision, imported only when a checkpoint is read.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import pickle
import shutil
import urllib.request  # not requests: the image that builds the model files installs servelab[model-files] alone
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from food11 import LABELS
from servelab.settings import ORIGINAL_CHECKPOINT, checkpoint_problem, settings

log = logging.getLogger(__name__)

UNTRAINED_SEED = 0
ORIGINAL_REPOSITORY = "teaching-on-testbeds/serve-system-chi"
ORIGINAL_COMMIT = "012a8b946b432f62e120d315ae974c54c303e9da"
ORIGINAL_URL = f"https://raw.githubusercontent.com/{ORIGINAL_REPOSITORY}/{ORIGINAL_COMMIT}/fastapi_pt/food11.pth"
ORIGINAL_GIT_BLOB = "b550214474f469ca65c2eb6c30f383ef4e7e8c7a"
DOWNLOAD_TIMEOUT_S = 60  # for the connection, then for each read: a stalled download ends, a slow one goes on


class ArtifactError(RuntimeError):
    """A problem the user can fix (bad checkpoint, wrong digest, no network); the message says how."""


@dataclass(frozen=True)
class WeightsSource:
    """Where the weights come from: a checkpoint (path or URL) with exactly one digest, or none
    (untrained). `WeightsSource("original")` is the original lab's file, by its URL and blob id."""

    checkpoint: str | None = None
    sha256: str | None = None
    git_blob: str | None = None

    def __post_init__(self) -> None:
        if problem := checkpoint_problem(self.checkpoint, self.sha256, self.git_blob):
            raise ArtifactError(problem)
        if self.checkpoint == ORIGINAL_CHECKPOINT:
            object.__setattr__(self, "checkpoint", ORIGINAL_URL)  # frozen: set once, here
            object.__setattr__(self, "git_blob", ORIGINAL_GIT_BLOB)

    @classmethod
    def configured(cls) -> WeightsSource:
        """What the settings name: FOOD11_CHECKPOINT and its digest (servelab.settings)."""
        chosen = settings()
        return cls(chosen.checkpoint, chosen.checkpoint_sha256, chosen.checkpoint_git_blob)

    @property
    def trained(self) -> bool:
        return self.checkpoint is not None

    def digest(self) -> tuple[str, str]:
        """The digest the file must have: ("sha256", hex) or ("git blob", hex)."""
        return ("sha256", self.sha256.lower()) if self.sha256 else ("git blob", str(self.git_blob).lower())

    def describe(self) -> str:
        if not self.trained:
            return f"untrained, seed {UNTRAINED_SEED}"
        kind, expected = self.digest()
        original = " (the original lab's trained weights)" if self.checkpoint == ORIGINAL_URL else ""
        return f"checkpoint {self.checkpoint}{original}, {kind} {expected}"


def _hexdigest(path: Path, digest: hashlib._Hash) -> str:
    """`digest` (a hashlib object) updated with the file's bytes, read a MiB at a time, in hex."""
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: Path) -> str:
    return _hexdigest(path, hashlib.sha256())


def git_blob_id(path: Path) -> str:
    """The id git gives the file's content (`git hash-object`): SHA-1 of "blob <size>\\0" and the bytes."""
    return _hexdigest(path, hashlib.sha1(f"blob {path.stat().st_size}\0".encode()))


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A checkpoint file whose digest matched its source's: the only kind `_unpickle` reads."""

    path: Path


def _mismatch(path: Path, source: WeightsSource) -> str | None:
    """The error for a file whose digest is not its source's, or None when it matches."""
    kind, expected = source.digest()
    actual = sha256_of(path) if kind == "sha256" else git_blob_id(path)
    if actual == expected:
        return None
    return f"Checksum mismatch for {source.checkpoint}: expected {kind} {expected}, got {actual}."


def _download(source: WeightsSource, to: Path) -> None:
    url = str(source.checkpoint)
    to.parent.mkdir(parents=True, exist_ok=True)
    log.info("Downloading %s", url)
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as answer, to.open("wb") as out:
            shutil.copyfileobj(answer, out)
    except (OSError, http.client.HTTPException) as exc:  # no network, refused, an HTTP error, a timeout, cut off
        to.unlink(missing_ok=True)
        kind, expected = source.digest()
        variable = "FOOD11_CHECKPOINT_SHA256" if kind == "sha256" else "FOOD11_CHECKPOINT_GIT_BLOB"
        raise ArtifactError(
            f"Could not download {url} ({exc}). On an offline machine, download it elsewhere, copy it here and "
            f"set FOOD11_CHECKPOINT=<its path> {variable}={expected} instead; or unset FOOD11_CHECKPOINT to serve "
            "untrained weights."
        ) from exc


def fetch_verified(source: WeightsSource, download_dir: Path) -> VerifiedCheckpoint:
    """The checkpoint `source` names, as a local file whose digest matched; a URL is downloaded
    into `download_dir` once, and kept only once it matched."""
    assert source.checkpoint is not None, "only a trained source has a checkpoint to fetch"
    if not source.checkpoint.startswith(("http://", "https://")):
        local = Path(source.checkpoint).expanduser()
        if not local.is_file():
            raise ArtifactError(f"FOOD11_CHECKPOINT={source.checkpoint} is not a file.")
        if problem := _mismatch(local, source):
            raise ArtifactError(
                f"{problem} It is not the file you meant: check its path and digest. Nothing was built."
            )
        log.info("%s: its %s is %s, as expected", local, *source.digest())
        return VerifiedCheckpoint(local)
    kind, expected = source.digest()
    local = download_dir / f"checkpoint-{kind.replace(' ', '-')}-{expected[:16]}.pth"
    fetched = local  # an earlier download is checked again, as every file is before it is read
    if not local.is_file():
        fetched = local.with_suffix(".part")
        _download(source, fetched)
    if problem := _mismatch(fetched, source):
        fetched.unlink()  # never left where a later build would take it for the file it names
        raise ArtifactError(
            f"{problem} The download was deleted and nothing was built: check FOOD11_CHECKPOINT and its digest. "
            "A file at a fixed commit never changes, so there a mismatch means a damaged or altered download: "
            "run again, from another network if it persists."
        )
    if fetched != local:
        fetched.replace(local)
    log.info("%s: its %s is %s, as expected", source.checkpoint, kind, expected)
    return VerifiedCheckpoint(local)


def _unpickle(checkpoint: VerifiedCheckpoint) -> Any:
    import torch

    try:
        return torch.load(checkpoint.path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # A whole pickled model, as the original lab's food11.pth is. Unpickling it runs code the
        # file names, which is safe only because its digest matched the one given (VerifiedCheckpoint).
        return torch.load(checkpoint.path, map_location="cpu", weights_only=False)


def _state_dict(loaded: Any, origin: str) -> tuple[dict, str]:
    """The state_dict of what a checkpoint held, and what it was, for messages."""
    import torch
    from torchvision.models import MobileNetV2

    if isinstance(loaded, torch.nn.Module):
        if not isinstance(loaded, MobileNetV2):
            raise ArtifactError(f"{origin} holds a whole pickled {type(loaded).__name__}, not a MobileNetV2.")
        return loaded.state_dict(), "a whole pickled MobileNetV2"
    for key in ("state_dict", "model_state_dict"):
        if isinstance(loaded, dict) and key in loaded:
            loaded = loaded[key]
    if not isinstance(loaded, dict) or not all(isinstance(value, torch.Tensor) for value in loaded.values()):
        raise ArtifactError(f"{origin} holds a {type(loaded).__name__}, not a MobileNetV2 state_dict or model.")
    return loaded, "a state_dict"


def trained_model(source: WeightsSource, download_dir: Path):
    """torchvision's MobileNetV2 with Food-11's 11 outputs, carrying the weights of the checkpoint
    `source` names (fetched and verified first)."""
    from torchvision.models import mobilenet_v2

    origin = str(source.checkpoint)
    checkpoint = fetch_verified(source, download_dir)
    try:
        loaded = _unpickle(checkpoint)
    except Exception as exc:  # whatever the file held, unreadable is the user's to fix: say what failed
        raise ArtifactError(
            f"{origin} could not be read as a PyTorch checkpoint ({type(exc).__name__}: {exc})."
        ) from exc
    state_dict, held = _state_dict(loaded, origin)
    head = state_dict.get("classifier.1.weight")
    if head is not None and head.shape[0] != len(LABELS):
        raise ArtifactError(
            f"{origin} holds {held} whose classifier has {head.shape[0]} outputs; the lab serves "
            f"Food-11's {len(LABELS)} classes: give a checkpoint of mobilenet_v2(num_classes={len(LABELS)})."
        )
    model = mobilenet_v2(num_classes=len(LABELS))
    try:
        model.load_state_dict(state_dict)
    except RuntimeError as exc:
        raise ArtifactError(
            f"{origin} holds {held} that does not fit torchvision's mobilenet_v2(num_classes={len(LABELS)}): {exc}"
        ) from exc
    log.info("%s holds %s with %d classes: its weights are the model's", origin, held, len(LABELS))
    return model
