"""Where a run's load goes, described once: the server, the model, what each request sends.

`Endpoint` is built where a run is asked for (the command line, the Lab, a test) and passed whole
to the function that makes the run's target from it (`make_target`, `make_sequence_target`,
`make_stream_target`). What holds for every target is checked here, once, as it is built; each
make_* function refuses the kinds it cannot serve. How much load goes there is the run's `Load`
(servelab.loadgen.load).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servelab import paths

if TYPE_CHECKING:  # the registry reads configs with tritonclient: imported where a model is looked up
    from servelab.triton.models import ModelRepository

TARGET_KINDS = ("fastapi", "triton-http", "triton-grpc")
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Endpoint:
    """kind: "fastapi" (address: a base URL, http://host:port) or "triton-http"/"triton-grpc"
    (address: host:port, and a `model` of `models`, the lab's registry by default). Each request
    sends `image_bytes` (the soup sample by default) or, FastAPI only, `image_url`, the photo's URL
    for the server to download; it fails after `timeout_s` seconds without its whole answer."""

    kind: str
    address: str
    model: str | None = None
    image_bytes: bytes | None = field(default=None, repr=False)  # a photo is too long to show
    timeout_s: float = DEFAULT_TIMEOUT_S
    models: ModelRepository | None = field(default=None, repr=False)
    image_url: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"unknown target kind {self.kind!r}; choose one of {', '.join(TARGET_KINDS)}")
        if self.image_url and self.kind != "fastapi":
            raise ValueError(f"a {self.kind} target sends tensors, not URLs: image_url is for FastAPI targets")
        if self.kind != "fastapi" and not self.model:
            raise ValueError(f"a {self.kind} target needs a model: one of {', '.join(self.registry.names())}")
        if self.timeout_s <= 0:
            raise ValueError("timeout_s must be positive")

    @property
    def image(self) -> bytes:
        """What each request sends: `image_bytes`, or the soup sample."""
        return paths.SAMPLE_IMAGE.read_bytes() if self.image_bytes is None else self.image_bytes

    @property
    def registry(self) -> ModelRepository:
        """Where the model's request is described: `models`, or the lab's registry."""
        from servelab.triton.models import ModelRepository

        return self.models or ModelRepository()

    @property
    def triton_model(self) -> str:
        """The model a Triton kind's requests go to (checked present when the Endpoint was built)."""
        assert self.model, "a Triton endpoint has a model"
        return self.model
