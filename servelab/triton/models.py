"""The lab's Triton models: one registry, read by every module that needs to know about a model.

Every folder of `models_staging/` is a model, in Triton's repository layout (`config.pbtxt` and
a numbered version folder). Both Tritons (the local stack's and the Compose project's) serve every
one of them: Docker loads the whole repository (`--load-model=*`), and the local stack stages and
loads each folder it finds.

What Triton needs is in the model's `config.pbtxt`, and the registry reads it from there (name,
backend, inputs and outputs, batch size, whether it is stateful). What only the lab knows comes
from the model's entry in `ENTRIES` below: how to turn a photo into a request, which generated
files `make artifacts` puts in its version folder, and which of them carries the weights record.

A model without an entry is still served and measured: its requests are seeded random values
of each input's declared shape, as perf_analyzer would send. Where the config does not say
enough for that, the lab says so and what to do, and never borrows another model's settings.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

import food11
from servelab import paths
from servelab.triton.adaptation import backend_of
from servelab.triton.config import ConfigError, TritonConfig

# How a photo becomes a request, for the models that classify photos.
IMAGE_FILE = "image file"  # the file's bytes, base64-encoded, in a BYTES input: the model decodes it
PREPROCESSED = "preprocessed tensor"  # FP32 [3, 224, 224], decoded and normalised by the client


@dataclass(frozen=True)
class LabEntry:
    """What the lab knows about a model that its config.pbtxt does not say."""

    description: str
    image_request: str | None = None  # IMAGE_FILE or PREPROCESSED; None: not a photo classifier
    # Model files `make artifacts` places in the version folder: file name -> what it is
    # ("pytorch weights" or "onnx graph"). The code a model.py imports is its runtime's and food11.py.
    artifacts: Mapping[str, str] = field(default_factory=dict)
    weights_file: str | None = None  # the artifact whose weights record the served config reports


ENTRIES: dict[str, LabEntry] = {
    "food_classifier": LabEntry(
        "MobileNetV2 (PyTorch) in the Python backend: an image file in, its label and probability out",
        image_request=IMAGE_FILE,
        artifacts={"food11.pth": "pytorch weights"},
        weights_file="food11.pth",
    ),
    "food_sequence": LabEntry(
        "The same PyTorch network on a stream of frames: each request one frame of a sequence, the "
        "sequence's running label and probabilities out (stateful: sequence batching)",
        image_request=IMAGE_FILE,
        artifacts={"food11.pth": "pytorch weights"},
        weights_file="food11.pth",
    ),
    "food_refine": LabEntry(
        "The ONNX network over N steps, a view of the photo each: decoupled, one response per step (the running "
        "label and probability), streamed over gRPC; it stops at the next step once the client cancels",
        image_request=IMAGE_FILE,
        artifacts={"model.onnx": "onnx graph"},
        weights_file="model.onnx",
    ),
    "food_classifier_onnx": LabEntry(
        "The same network as an ONNX graph: a preprocessed tensor in, 11 scores out",
        image_request=PREPROCESSED,
        artifacts={"model.onnx": "onnx graph"},
        weights_file="model.onnx",
    ),
}


# The files `make artifacts` builds, by what each is (the values of LabEntry.artifacts), as they
# are named in the artifacts folder (servelab.paths.ARTIFACTS_DIR).
BUILT_FILES: dict[str, str] = {"pytorch weights": "food11.pth", "onnx graph": "food11.onnx"}


class ModelError(LookupError):
    """An unknown model, a model folder the lab cannot use, or a request it cannot build."""


def model_file_places(repository: Path, built: Path) -> list[tuple[Path, Path]]:
    """(file in the artifacts folder `built`, where a model of `repository` loads it) for every
    generated file of every model in the registry: its version 1. `make artifacts` places them in
    models_staging/; the Triton container's start, in its copy of the repository it serves."""
    places = []
    for name, entry in ENTRIES.items():
        for file_name, kind in entry.artifacts.items():
            if kind not in BUILT_FILES:
                raise ModelError(
                    f"servelab/triton/models.py: {name}'s artifact {file_name} is a {kind!r}; "
                    f"`make artifacts` builds: {', '.join(BUILT_FILES)}."
                )
            places.append((built / BUILT_FILES[kind], repository / name / "1" / file_name))
    return places


@dataclass(frozen=True)
class Tensor:
    """One input or output as the config declares it."""

    name: str
    datatype: str  # KServe v2 name, as clients send it: "FP32", "BYTES", "INT64"...
    dims: tuple[int, ...]  # without the batch dimension; -1 means any size


@dataclass(frozen=True)
class RequestTensor:
    """One input of a request: a batch of values for a declared input."""

    name: str
    datatype: str
    array: np.ndarray  # shape [batch, *dims]

    def binary(self) -> bytes:
        """Triton's binary tensor encoding: raw little-endian values; for BYTES, each element as a
        4-byte little-endian length followed by its bytes."""
        if self.datatype == "BYTES":
            return b"".join(struct.pack("<I", len(item)) + item for item in self.array.flat)
        return self.array.astype(self.array.dtype.newbyteorder("<")).tobytes()


@dataclass(frozen=True)
class ModelRequest:
    """Everything one inference request to a model carries, and the outputs it asks for."""

    inputs: tuple[RequestTensor, ...]
    outputs: tuple[str, ...]

    def repeated(self, size: int) -> ModelRequest:
        """This request of one inference `size` times over: one request of a batch of `size`, as
        perf_analyzer's `-b` sends (the same input in every place)."""
        tensors = (RequestTensor(t.name, t.datatype, np.repeat(t.array, size, axis=0)) for t in self.inputs)
        return ModelRequest(tuple(tensors), self.outputs)


_NUMPY_TYPES = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
}


def _datatype(config_type: int) -> str:
    from tritonclient.grpc import model_config_pb2

    name = model_config_pb2.DataType.Name(config_type).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


@dataclass(frozen=True)
class Model:
    """One model folder: its config as shipped, and the lab's entry for it (if any)."""

    name: str
    folder: Path
    entry: LabEntry | None

    @cached_property
    def config(self) -> TritonConfig:
        return TritonConfig.read(self.folder / "config.pbtxt", origin=f"models_staging/{self.name}/config.pbtxt")

    @property
    def backend(self) -> str:
        return backend_of(self.config.proto)

    @property
    def max_batch_size(self) -> int:
        return self.config.proto.max_batch_size

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(Tensor(item.name, _datatype(item.data_type), tuple(item.dims)) for item in self.config.proto.input)

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(
            Tensor(item.name, _datatype(item.data_type), tuple(item.dims)) for item in self.config.proto.output
        )

    @property
    def stateful(self) -> bool:
        """A sequence-batched model keeps state per sequence: each request needs a sequence ID."""
        return self.config.proto.HasField("sequence_batching")

    @property
    def decoupled(self) -> bool:
        """A decoupled model sends any number of responses per request (food_refine: one per step),
        which only gRPC streaming reads: Triton's HTTP /infer refuses it."""
        return self.config.proto.model_transaction_policy.decoupled

    def version_folders(self, root: Path | None = None) -> list[Path]:
        """The numbered version folders, in `root` (a staged copy) or in the model's own folder."""
        base = root or self.folder
        return sorted((p for p in base.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))

    def weights_info(self, root: Path | None = None) -> dict[str, str] | None:
        """The weights record (`weights`, `weights_note`) for the served config, or None when the
        model has no generated weights. A missing record says "unknown", never guesses."""
        if self.entry is None or self.entry.weights_file is None:
            return None
        versions = self.version_folders(root)
        record = food11.read_weights_info(versions[-1] / self.entry.weights_file) if versions else {}
        return {"weights": record.get("weights", "unknown"), "weights_note": record.get("note", "")}

    # ---- requests ----------------------------------------------------------------------------

    def request(self, image: bytes | None = None, seed: int = 0) -> ModelRequest:
        """A request of batch size one: built from `image` for a photo classifier; otherwise seeded
        random values of each input's declared shape. For a stateful model it is one step of a
        sequence (a frame): the sequence ID and the start/end flags are options of the request,
        which the client adds."""
        kind = self.entry.image_request if self.entry else None
        outputs = tuple(output.name for output in self.outputs)
        if kind is not None:
            image = image if image is not None else paths.SAMPLE_IMAGE.read_bytes()
            (declared,) = self.inputs
            if kind == IMAGE_FILE:
                array = np.array([[base64.b64encode(image)]], dtype=object)
            else:
                array = food11.preprocess(food11.decode_image_bytes(image))[None]
            return ModelRequest((RequestTensor(declared.name, declared.datatype, array),), outputs)
        rng = np.random.default_rng(seed)
        tensors = []
        for declared in self.inputs:
            self._require_fixed_shape(declared, "build a request for it")
            if declared.datatype == "BYTES":
                raise ModelError(
                    f"{self.name}: input {declared.name} holds strings, and the lab cannot guess their content. "
                    f"Add an entry for {self.name} in servelab/triton/models.py (ENTRIES) that says how to build "
                    "its request."
                )
            shape = (1, *declared.dims)
            values = rng.standard_normal(shape) if declared.datatype.startswith("FP") else rng.integers(0, 2, shape)
            tensors.append(
                RequestTensor(declared.name, declared.datatype, values.astype(_NUMPY_TYPES[declared.datatype]))
            )
        return ModelRequest(tuple(tensors), outputs)

    def perf_analyzer_input(self, image: bytes, work_dir: Path) -> dict:
        """perf_analyzer's options for this model's input (`input_data` or nothing: perf_analyzer
        sends random data of the declared shapes itself)."""
        if self.entry is not None and self.entry.image_request == IMAGE_FILE:
            (declared,) = self.inputs
            data = work_dir / f"perf_input_{self.name}.json"
            data.parent.mkdir(parents=True, exist_ok=True)
            content = {declared.name: {"content": [base64.b64encode(image).decode()], "shape": list(declared.dims)}}
            data.write_text(json.dumps({"data": [content]}))
            return {"input_data": data}
        for declared in self.inputs:
            self._require_fixed_shape(declared, "measure it with perf_analyzer")
        return {}

    def _require_fixed_shape(self, declared: Tensor, purpose: str) -> None:
        if -1 in declared.dims:
            raise ModelError(
                f"{self.name}: input {declared.name} has a variable size (dims {list(declared.dims)}), so the lab "
                f"cannot {purpose} from the config alone. Give perf_analyzer a shape yourself, e.g. "
                f"lab.triton.perf('{self.name}', shape=['{declared.name}:4']), or fix the dims in its config.pbtxt."
            )


class ModelRepository:
    """The models of one Triton model repository folder (models_staging/, or a copy of it)."""

    def __init__(self, folder: Path = paths.MODELS_STAGING_DIR, entries: Mapping[str, LabEntry] = ENTRIES) -> None:
        self.folder = Path(folder)
        self.entries = entries

    def names(self) -> list[str]:
        """Every model folder's name (hidden folders and __pycache__ are not models)."""
        return sorted(p.name for p in self.folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))

    def get(self, name: str) -> Model:
        """The model called `name`, checked; an unknown name is an error that lists the known ones."""
        if name not in self.names():
            raise ModelError(
                f"There is no model {name!r} in {self.folder.name}/: the lab's models are {', '.join(self.names())}. "
                f"A new model is a folder there (config.pbtxt and 1/), plus an entry in servelab/triton/models.py "
                "if it takes a photo."
            )
        model = Model(name, self.folder / name, self.entries.get(name))
        _check_folder(model)
        return model

    def __iter__(self) -> Iterator[Model]:
        return (self.get(name) for name in self.names())

    def check(self) -> list[Model]:
        """Every model, each folder checked (the first problem raises, naming its folder)."""
        return list(self)


def _check_folder(model: Model) -> None:
    where = f"{model.folder.parent.name}/{model.name}"
    if not (model.folder / "config.pbtxt").is_file():
        raise ModelError(f"{where} has no config.pbtxt. Every model folder needs one (Triton's repository layout).")
    try:
        declared = model.config.name
    except ConfigError as exc:
        raise ModelError(str(exc)) from None
    if declared and declared != model.name:
        raise ModelError(
            f'{where}/config.pbtxt says name: "{declared}". Triton requires the name to be the folder\'s: '
            f"rename one of them."
        )
    if not model.version_folders():
        generated = model.entry is not None and model.entry.artifacts
        raise ModelError(
            f"{where} has no version folder (1/, with the model's files), so Triton would not load it"
            + (": run `make artifacts`, which builds them." if generated else ".")
        )
    if model.entry is not None and model.entry.image_request is not None:
        if model.entry.image_request not in (IMAGE_FILE, PREPROCESSED):
            raise ModelError(
                f"servelab/triton/models.py: {model.name}'s image_request must be IMAGE_FILE, PREPROCESSED or None."
            )
        if len(model.inputs) != 1:
            raise ModelError(
                f"{where}: a photo classifier takes one input, but its config declares {len(model.inputs)}."
            )
