"""GourmetGram's pages with no backend running (tests/helpers/gourmetgram.py): the form, upload
validation and limits, the /test whitelist, error statuses when the backend is down, /healthz.
Tests against real servers: tests/test_gourmetgram_integration.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import closed_port
from tests.helpers.gourmetgram import BACKEND_CONFIGS, GOURMETGRAM_DIR, gg, jpeg_bytes, make_app


@pytest.fixture
def port() -> int:
    return closed_port()


@pytest.fixture
def client(port: int) -> Any:
    return make_app(FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}").test_client()


# --- Pages and upload validation ---------------------------------------------------------------


def test_upload_form_renders(client: Any) -> None:
    response = client.get("/")
    body = response.get_data(as_text=True)
    assert response.status_code == 200
    assert 'enctype="multipart/form-data"' in body
    assert 'action="/predict"' in body
    assert 'type="file" name="file"' in body
    assert "/test?sample=bread.jpg" in body  # the bundled samples are offered


@pytest.mark.parametrize(
    ("content", "filename", "says"),
    [
        (b"this is not a picture", "food.jpg", "not an image Pillow can read"),
        (b"", "food.jpg", "The image is empty"),
        (jpeg_bytes(), "", "No file chosen"),
        (None, None, "No file chosen"),  # no file field at all
        *[(jpeg_bytes(), name, "not accepted") for name in ["food.exe", "food.svg", "food", "food.jpg.html"]],
    ],
)
def test_a_bad_upload_gets_400_saying_what_is_wrong(client: Any, content: bytes, filename: str, says: str) -> None:
    form = {"other": "value"} if content is None else {"file": (io.BytesIO(content), filename)}
    response = client.post("/predict", data=form)
    assert response.status_code == 400
    assert says in response.get_data(as_text=True)


def test_oversize_upload_gets_413_page(port: int) -> None:
    client = make_app(FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}", MAX_UPLOAD_BYTES=2048).test_client()
    response = client.post("/predict", data={"file": (io.BytesIO(b"\xff" * 10_000), "big.jpg")})
    body = response.get_data(as_text=True)
    assert response.status_code == 413
    assert "too large" in body and "2048 bytes" in body
    # A body under the limit is parsed normally (and here refused as not an image, not as too big).
    response = client.post("/predict", data={"file": (io.BytesIO(b"\xff" * 100), "small.jpg")})
    assert response.status_code == 400


def test_displayed_filename_is_sanitised(client: Any) -> None:
    response = client.post("/predict", data={"file": (io.BytesIO(b"nope"), "../../<b>evil</b>.exe")})
    body = response.get_data(as_text=True)
    assert response.status_code == 400
    assert "<b>evil" not in body and "../" not in body


# --- /test and its whitelist -------------------------------------------------------------------


@pytest.mark.parametrize("sample", ["../../etc/passwd", "pizza.jpg"])
def test_a_sample_not_in_the_whitelist_is_404_naming_the_valid_ones(client: Any, sample: str) -> None:
    response = client.get("/test", query_string={"sample": sample})
    body = response.get_data(as_text=True)
    assert response.status_code == 404
    assert "No such sample" in body and "Valid names: bread.jpg, fried_egg.jpg, soup.jpg" in body
    assert "root:" not in body


def test_samples_whitelist_lists_only_images(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(jpeg_bytes())
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "sub.png").mkdir()
    assert list(gg.list_samples(tmp_path)) == ["a.jpg"]
    assert gg.list_samples(tmp_path / "missing") == {}


def test_bundled_samples_are_real_images() -> None:
    samples = gg.list_samples(GOURMETGRAM_DIR / "static" / "samples")
    assert len(samples) >= 3
    for path in samples.values():
        assert gg.food11.decode_image_bytes(path.read_bytes()).size == (512, 384)


# --- Backend down ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(BACKEND_CONFIGS))
def test_backend_unreachable_gives_503_and_app_keeps_serving(kind: str, port: int) -> None:
    client = make_app(**BACKEND_CONFIGS[kind](port)).test_client()
    response = client.get("/test", query_string={"sample": "soup.jpg"})
    body = response.get_data(as_text=True)
    assert response.status_code == 503
    assert f"127.0.0.1:{port}" in body
    assert "make up" in body
    assert "data:image/jpeg;base64," in body  # the image is shown inline, never stored

    # The failure did not take the app down: the form still renders, and an upload fails the same way.
    assert client.get("/").status_code == 200
    response = client.post("/predict", data={"file": (io.BytesIO(jpeg_bytes()), "lunch.png")})
    assert response.status_code == 503
    assert f"127.0.0.1:{port}" in response.get_data(as_text=True)


def test_banner_says_unknown_when_backend_unreachable(client: Any) -> None:
    body = client.get("/").get_data(as_text=True)
    assert "Weights status unknown (backend unreachable)" in body
    assert "not meaningful" in body


@pytest.mark.parametrize(
    ("config", "backend", "url", "model", "model_input"),
    [
        ("fastapi", "fastapi", "http://127.0.0.1:{port}", "food11", "image file (base64)"),
        # Triton's model input is not known before a request has asked Triton.
        ("triton_onnx", "triton", "127.0.0.1:{port}", "food_classifier_onnx", None),
    ],
)
def test_healthz_is_200_and_names_the_backend_its_model_and_that_it_is_down(
    port: int, config: str, backend: str, url: str, model: str, model_input: str | None
) -> None:
    response = make_app(**BACKEND_CONFIGS[config](port)).test_client().get("/healthz")
    data = response.get_json()
    assert response.status_code == 200 and data["status"] == "ok"
    assert (data["backend"], data["backend_url"], data["model"]) == (backend, url.format(port=port), model)
    assert data["model_input"] == model_input
    assert data["backend_reachable"] is False and data["weights"] == "unknown"
