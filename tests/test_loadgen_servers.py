"""The load generator against the lab's real servers: both FastAPI services and Triton, over HTTP
and gRPC, with what each answers and the errors counted by status.
"""

from __future__ import annotations

import base64

import pytest
import requests
import tritonclient.http as httpclient

import food11
from food11 import LABELS
from servelab import loadgen
from servelab.loadgen import TritonHttpTarget, closed_loop
from servelab.results import RunResult

# ---- the real servers ----------------------------------------------------------------------

TRITON_MODELS = ["food_classifier", "food_classifier_onnx"]


@pytest.mark.integration
@pytest.mark.parametrize("flavor", ["pt", "onnx"])
def test_fastapi_services_answer_every_request(fastapi_urls, flavor):
    result = closed_loop(loadgen.Endpoint("fastapi", fastapi_urls[flavor]), loadgen.Load(2, 10), progress=False)
    assert result.errors == {} and result.requests == 10


@pytest.mark.integration
@pytest.mark.parametrize("model", TRITON_MODELS)
@pytest.mark.parametrize("kind", ["triton-http", "triton-grpc"])
def test_triton_answers_every_request(triton_http_url, triton_grpc_url, kind, model):
    address = triton_http_url if kind == "triton-http" else triton_grpc_url
    result = closed_loop(loadgen.Endpoint(kind, address, model), loadgen.Load(2, 10), progress=False)
    assert result.errors == {} and result.requests == 10, result.errors
    assert result.name == f"triton/{model} ({kind.split('-')[1]})"


def _post_binary(target: TritonHttpTarget) -> httpclient.InferResult:
    response = requests.post(str(target.url), data=target.body, headers=target.headers, timeout=30)
    assert response.status_code == 200, response.text
    header_length = response.headers.get("Inference-Header-Content-Length")
    return httpclient.InferResult.from_response_body(response.content, header_length=int(header_length))


@pytest.mark.integration
def test_binary_http_requests_are_understood_by_triton(triton_http_url, fastapi_urls, test_images):
    """The hand-built binary bodies give the same answers as the FastAPI services."""
    image = test_images[1]
    expected = {
        flavor: requests.post(
            f"{fastapi_urls[flavor]}/predict", json={"image": base64.b64encode(image).decode()}, timeout=30
        ).json()
        for flavor in ("pt", "onnx")
    }
    answer = _post_binary(TritonHttpTarget(triton_http_url, "food_classifier", image))
    assert answer.as_numpy("FOOD_LABEL").reshape(-1)[0].decode() == expected["pt"]["prediction"]
    assert answer.as_numpy("PROBABILITY").reshape(-1)[0] == pytest.approx(expected["pt"]["probability"], abs=1e-4)

    logits = _post_binary(TritonHttpTarget(triton_http_url, "food_classifier_onnx", image)).as_numpy("output")
    assert logits.shape == (1, 11)
    [(label, probability)] = food11.top_prediction(logits)
    assert label in LABELS and label == expected["onnx"]["prediction"]
    assert probability == pytest.approx(expected["onnx"]["probability"], abs=1e-4)


@pytest.mark.integration
def test_triton_errors_are_counted_by_status(triton_http_url, triton_grpc_url):
    # The Python backend reports a bad image as an internal error: HTTP 500, gRPC INTERNAL.
    def bad(kind: str, address: str) -> RunResult:
        return closed_loop(
            loadgen.Endpoint(kind, address, "food_classifier", b"no image"), loadgen.Load(1, 2), progress=False
        )

    assert bad("triton-http", triton_http_url).errors == {"http_500": 2}
    assert bad("triton-grpc", triton_grpc_url).errors == {"grpc_INTERNAL": 2}
