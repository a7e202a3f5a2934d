"""gRPC calls to the stateful `food_sequence` model of the session's Triton, served with a tiny
state cache (TINY_CACHE) for the tests of sequences, and what the model's log has counted."""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from servelab import paths
from servelab.lab.triton_configs import MODEL_LOAD_TIMEOUT_S
from servelab.polling import settled
from servelab.triton import stats as triton_stats

MODEL = "food_sequence"
TINY_CACHE = {"state_capacity": "3"}
TRITON_REFUSES = "must specify the START flag on the first request of the sequence"
sequence_ids = itertools.count(1000)


class Sequences:
    """gRPC calls to food_sequence, and what its log has counted so far."""

    def __init__(self, grpc_url: str, http_url: str, metrics_url: str, log_path) -> None:
        self.grpc_url, self.http_url, self.metrics_url, self.log_path = grpc_url, http_url, metrics_url, log_path
        self.client = grpcclient.InferenceServerClient(grpc_url)

    @staticmethod
    def frame(image: bytes, module=grpcclient):
        tensor = module.InferInput("FRAME", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[base64.b64encode(image)]], dtype=object))
        return [tensor]

    def send(self, sequence_id: int, image: bytes, client=None, **options) -> dict:
        result = (client or self.client).infer(MODEL, self.frame(image), sequence_id=sequence_id, **options)
        return {
            "label": result.as_numpy("SEQUENCE_LABEL")[0, 0].decode(),
            "probability": float(result.as_numpy("SEQUENCE_PROBABILITY")[0, 0]),
            "probabilities": result.as_numpy("SEQUENCE_PROBABILITIES")[0],
            "frame_label": result.as_numpy("FRAME_LABEL")[0, 0].decode(),
            "frames_seen": int(result.as_numpy("FRAMES_SEEN")[0, 0]),
        }

    def refusal(self, sequence_id: int, image: bytes, **options) -> InferenceServerException:
        with pytest.raises(InferenceServerException) as refused:
            self.send(sequence_id, image, **options)
        return refused.value

    def events(self) -> dict[str, int]:
        # The model logs before it answers, but the line reaches the server's log a moment later.
        return settled(lambda: triton_stats.sequence_events(self.log_path.read_text(), MODEL))

    def still_serving(self, image: bytes) -> None:
        sequence_id = next(sequence_ids)
        assert self.send(sequence_id, image, sequence_start=True, sequence_end=True)["frames_seen"] == 1


def load(http_url: str, config: dict) -> None:
    # A load starts the model's Python process, which imports PyTorch: past tritonclient's 60 s on a busy machine.
    client = httpclient.InferenceServerClient(http_url, network_timeout=MODEL_LOAD_TIMEOUT_S)
    client.load_model(MODEL, config=json.dumps(config))
    # Its first execution builds what the model builds lazily, seconds on a busy machine: paid here,
    # where no test's timeout (idle, sequence) is running.
    warm_up = {"sequence_id": next(sequence_ids), "sequence_start": True, "sequence_end": True}
    client.infer(MODEL, Sequences.frame(paths.SAMPLE_IMAGE.read_bytes(), httpclient), **warm_up)


def with_parameters(config: dict, parameters: dict[str, str]) -> dict:
    edited = json.loads(json.dumps(config))
    edited["parameters"].update({key: {"string_value": value} for key, value in parameters.items()})
    return edited


@contextlib.contextmanager
def served_with_tiny_cache(model_servers, ports, http_url: str, grpc_url: str) -> Iterator[Sequences]:
    """The session's Triton serving MODEL with TINY_CACHE in the block, then its shipped config again."""
    shipped = httpclient.InferenceServerClient(http_url).get_model_config(MODEL)
    (triton,) = [managed for managed in model_servers.processes if managed.spec.name == "triton"]
    load(http_url, with_parameters(shipped, TINY_CACHE))
    metrics = f"http://127.0.0.1:{ports.triton_metrics}/metrics"
    try:
        yield Sequences(grpc_url, http_url, metrics, triton.log_path)
    finally:
        # Loading without a config keeps the last one given when the files did not change: give the
        # shipped one back explicitly.
        load(http_url, shipped)
