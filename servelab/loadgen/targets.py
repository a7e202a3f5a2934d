"""Targets: an `Endpoint` (servelab.loadgen.endpoint) with one prepared request, sent again and again.

Every request of a run sends the same image, prepared once per target: the request body (or gRPC
tensors) is built up front and reused, connections are reused, and only the response status is
checked. This keeps the generator cheap enough to keep up with perf_analyzer (C++) on a small
machine. What a Triton model's request holds comes from the lab's model registry
(servelab.triton.models), so any model in models_staging/ can be a target.
"""

from __future__ import annotations

import base64
import json
import logging
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from servelab.loadgen.endpoint import DEFAULT_TIMEOUT_S, Endpoint
from servelab.loadgen.http import HttpError, PreparedPost

if TYPE_CHECKING:
    from servelab.triton.models import ModelRepository, ModelRequest

# tritonclient, and the lab's model registry that reads configs with it, are imported where a Triton
# request is built or sent: a plain HTTP load (the GPU check's, on a bare machine) runs without them.

log = logging.getLogger(__name__)


class RequestError(Exception):
    """One request failed; `kind` is the name it is counted under in `RunResult.errors`."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.detail = detail


class Target(ABC):
    """A server endpoint with one prepared request. `open` before sending, `close` after.

    The runners open and close the target themselves, so one target can serve several runs.
    """

    name: str

    @abstractmethod
    async def open(self, connections: int) -> None:
        """Connect; up to `connections` requests will be in flight at once."""

    @abstractmethod
    async def send(self) -> None:
        """Send the request and wait for the whole answer; raise `RequestError` if it failed."""

    @abstractmethod
    async def close(self) -> None:
        """Release the connections."""


class HttpTarget(Target):
    """POST the same body to the same URL, over kept-alive connections (servelab.loadgen.http)."""

    def __init__(self, name: str, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> None:
        self.name = name
        self.url, self.body, self.headers = url, body, headers
        self.timeout_s = timeout_s
        # Built once: the request's bytes are the same for every send.
        self._post = PreparedPost(url, body, headers, timeout_s)

    async def open(self, connections: int) -> None:
        """Connections are opened as senders need them, and kept for the next request."""

    async def send(self) -> None:
        try:
            status, answer = await self._post.send()
        except HttpError as exc:
            raise RequestError(exc.kind, str(exc)) from exc
        if status != 200:
            raise RequestError(f"http_{status}", answer[:300].decode(errors="replace"))

    async def close(self) -> None:
        self._post.close()

    @property
    def idle_connections(self) -> int:
        return self._post.idle_connections


class FastAPITarget(HttpTarget):
    """POST {base_url}/predict with {"image": "<base64 JPEG>"}, or {"url": image_url}: the server
    then downloads the photo itself."""

    def __init__(
        self,
        base_url: str,
        image_bytes: bytes,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
        image_url: str | None = None,
    ) -> None:
        payload = {"url": image_url} if image_url else {"image": base64.b64encode(image_bytes).decode()}
        body = json.dumps(payload).encode()
        super().__init__(
            name or f"fastapi ({base_url})",
            f"{base_url.rstrip('/')}/predict",
            body,
            {"Content-Type": "application/json"},
            timeout_s,
        )


class TritonHttpTarget(HttpTarget):
    """KServe v2 inference over HTTP, with Triton's binary tensor extension.

    The body is a JSON header describing the tensors, followed directly by the raw tensor
    bytes. `Inference-Header-Content-Length` tells Triton where the JSON ends. Asking for binary
    outputs also spares the server from writing numbers as JSON text. perf_analyzer sends the
    same kind of request.
    """

    def __init__(
        self,
        host_port: str,
        model: str,
        image_bytes: bytes,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
        models: ModelRepository | None = None,
        batch_size: int = 1,
    ) -> None:
        request = model_request(model, image_bytes, models)
        tensors, raw = binary_inference_parts(request.repeated(batch_size))
        header = json.dumps(tensors).encode()
        super().__init__(
            name or f"triton/{model} (http)",
            f"http://{host_port_of(host_port)}/v2/models/{model}/infer",
            header + raw,
            {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"},
            timeout_s,
        )


def binary_inference_parts(request: ModelRequest) -> tuple[dict, bytes]:
    """A KServe v2 binary request's JSON header (its inputs and outputs) and the raw tensor bytes
    that follow it."""
    raw = [tensor.binary() for tensor in request.inputs]
    header = {
        "inputs": [
            {
                "name": tensor.name,
                "shape": list(tensor.array.shape),
                "datatype": tensor.datatype,
                "parameters": {"binary_data_size": len(data)},
            }
            for tensor, data in zip(request.inputs, raw, strict=True)
        ],
        "outputs": [{"name": output, "parameters": {"binary_data": True}} for output in request.outputs],
    }
    return header, b"".join(raw)


class TritonGrpcTarget(Target):
    """KServe v2 inference over gRPC, through tritonclient's asyncio client on one channel."""

    def __init__(
        self,
        host_port: str,
        model: str,
        image_bytes: bytes,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        name: str | None = None,
        models: ModelRepository | None = None,
    ) -> None:
        self.name = name or f"triton/{model} (grpc)"
        self.host_port = host_port_of(host_port)
        self.model = model
        self.timeout_s = timeout_s
        self.inputs, self.outputs = grpc_tensors(model_request(model, image_bytes, models))
        self._client: Any = None  # tritonclient's asyncio InferenceServerClient, once open

    async def open(self, connections: int) -> None:
        import tritonclient.grpc.aio as grpcclient_aio

        # gRPC multiplexes every request over the channel's one HTTP/2 connection.
        self._client = grpcclient_aio.InferenceServerClient(self.host_port)

    async def send(self) -> None:
        from tritonclient.utils import InferenceServerException

        assert self._client is not None, "open() before sending"
        try:
            await self._client.infer(self.model, self.inputs, outputs=self.outputs, client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            raise RequestError(grpc_error_kind(exc), exc.message() or "") from exc

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def grpc_tensors(request: ModelRequest) -> tuple[list[Any], list[Any]]:
    """tritonclient's inputs (serialised here, once) and requested outputs for `request`."""
    import tritonclient.grpc as grpcclient

    inputs = []
    for tensor in request.inputs:
        inputs.append(grpcclient.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype))
        inputs[-1].set_data_from_numpy(tensor.array)
    return inputs, [grpcclient.InferRequestedOutput(output) for output in request.outputs]


def grpc_error_kind(exc: Any) -> str:
    """The kind a tritonclient InferenceServerException is counted under."""
    status = exc.status()  # e.g. "StatusCode.UNAVAILABLE"; None when the client itself refused
    if status is None:
        return "triton_error"
    code = status.rsplit(".", 1)[-1]
    return "timeout" if code == "DEADLINE_EXCEEDED" else f"grpc_{code}"


def model_request(model: str, image_bytes: bytes, models: ModelRepository | None) -> ModelRequest:
    """The request for `model`, as the registry says to build it (an unknown model is an error)."""
    from servelab.triton.models import ModelRepository

    return (models or ModelRepository()).get(model).request(image_bytes)


def host_port_of(address: str) -> str:
    """Triton addresses are host:port; accept a pasted http:// URL too."""
    return address.split("://", 1)[-1].rstrip("/")


def make_target(endpoint: Endpoint) -> Target:
    """The target that sends `endpoint`'s request: FastAPI's /predict, or a Triton model's
    inference over HTTP or gRPC."""
    if endpoint.kind == "fastapi":
        return FastAPITarget(endpoint.address, endpoint.image, endpoint.timeout_s, image_url=endpoint.image_url)
    target_class = TritonHttpTarget if endpoint.kind == "triton-http" else TritonGrpcTarget
    return target_class(
        endpoint.address, endpoint.triton_model, endpoint.image, endpoint.timeout_s, models=endpoint.models
    )
