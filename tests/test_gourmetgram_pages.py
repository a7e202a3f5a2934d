"""GourmetGram's pages with no backend running (tests/helpers/gourmetgram.py): the form, upload
validation and limits, the /test whitelist, error statuses when the backend is down, /healthz.
Tests against real servers: tests/test_gourmetgram_integration.py."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import closed_port
from tests.helpers.gourmetgram import BACKEND_CONFIGS, GOURMETGRAM_DIR, forget_backend_env, gg, jpeg_bytes, make_app


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    forget_backend_env(monkeypatch)


@pytest.fixture
def port() -> int:
    return closed_port()


@pytest.fixture
def client(port: int) -> Any:
    return make_app(FASTAPI_SERVER_URL=f"http://127.0.0.1:{port}").test_client()


def upload(client: Any, content: bytes, filename: str) -> Any:
    return client.post("/predict", data={"file": (io.BytesIO(content), filename)})


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
        *[(jpeg_bytes(), name, "not accepted") for name in ["food.exe", "food.svg", "food", "food.jpg.html"]],
    ],
)
def test_a_bad_upload_gets_400_saying_what_is_wrong(client: Any, content: bytes, filename: str, says: str) -> None:
    response = upload(client, content, filename)
    assert response.status_code == 400
    assert says in response.get_data(as_text=True)


def test_missing_file_field_gets_400(client: Any) -> None:
    response = client.post("/predict", data={"other": "value"})
    assert response.status_code == 400
    assert "No file chosen" in response.get_data(as_text=True)


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


def test_sample_path_traversal_is_404(client: Any) -> None:
    response = client.get("/test", query_string={"sample": "../../etc/passwd"})
    body = response.get_data(as_text=True)
    assert response.status_code == 404
    assert "Valid names: bread.jpg, fried_egg.jpg, soup.jpg" in body
    assert "root:" not in body


def test_unknown_sample_is_404(client: Any) -> None:
    response = client.get("/test", query_string={"sample": "pizza.jpg"})
    assert response.status_code == 404
    assert "No such sample" in response.get_data(as_text=True)


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


def test_healthz_is_200_and_reports_backend_down(client: Any, port: int) -> None:
    response = client.get("/healthz")
    data = response.get_json()
    assert response.status_code == 200
    assert data["status"] == "ok"
    assert data["backend"] == "fastapi"
    assert data["backend_url"] == f"http://127.0.0.1:{port}"
    assert data["backend_reachable"] is False
    assert data["weights"] == "unknown"
    assert "model" in data


def test_healthz_for_triton_names_the_model(port: int) -> None:
    data = make_app(**BACKEND_CONFIGS["triton_onnx"](port)).test_client().get("/healthz").get_json()
    assert data["backend"] == "triton"
    assert data["backend_url"] == f"127.0.0.1:{port}"
    assert data["model"] == "food_classifier_onnx"
    assert data["model_input"] is None  # not known before a request has asked Triton
    assert data["backend_reachable"] is False


def test_healthz_for_fastapi_says_the_page_sends_the_file(client: Any) -> None:
    assert client.get("/healthz").get_json()["model_input"] == "image file (base64)"
