"""The shared labels and preprocessing every service uses."""

import base64
import io

import numpy as np
import pytest
from PIL import Image

import food11
from tests.helpers import make_image_bytes


def test_labels_are_the_eleven_food11_classes_in_order():
    assert food11.LABELS == (
        "Bread",
        "Dairy product",
        "Dessert",
        "Egg",
        "Fried food",
        "Meat",
        "Noodles/Pasta",
        "Rice",
        "Seafood",
        "Soup",
        "Vegetable/Fruit",
    )


def test_preprocess_resizes_and_normalizes_with_imagenet_statistics_as_the_textbook_formula_does():
    image = food11.decode_image_bytes(make_image_bytes(2, size=(512, 384)))
    resized = np.asarray(image.resize((224, 224), Image.BILINEAR), dtype=np.float32) / 255.0
    textbook = ((resized - food11.IMAGENET_MEAN) / food11.IMAGENET_STD).transpose(2, 0, 1)
    tensor = food11.preprocess(image)
    assert tensor.shape == (3, 224, 224) and tensor.dtype == np.float32 and tensor.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(tensor, textbook, atol=1e-5)


def test_preprocess_converts_grayscale_and_alpha_images_to_rgb():
    for mode in ("L", "RGBA", "P"):
        assert food11.preprocess(Image.new(mode, (64, 64))).shape == (3, 224, 224)


def test_decode_base64_image_roundtrip():
    raw = make_image_bytes(1, fmt="PNG")
    image = food11.decode_base64_image(base64.b64encode(raw).decode())
    assert image.mode == "RGB" and image.size == (320, 240)


@pytest.mark.parametrize(
    "payload, message",
    [
        ("not base64 !!!", "not valid base64"),
        (base64.b64encode(b"plain text, not an image").decode(), "not an image"),
        ("", "empty"),
    ],
)
def test_decode_rejects_what_is_not_an_image_with_a_helpful_message(payload, message):
    with pytest.raises(food11.InvalidImageError, match=message):
        food11.decode_base64_image(payload)


def test_decode_rejects_images_with_too_many_pixels(monkeypatch):
    monkeypatch.setattr(food11, "MAX_IMAGE_PIXELS", 100 * 100)
    buffer = io.BytesIO()
    Image.new("RGB", (200, 200)).save(buffer, "PNG")
    with pytest.raises(food11.InvalidImageError, match="pixels"):
        food11.decode_image_bytes(buffer.getvalue())


def test_decode_rejects_a_truncated_jpeg():
    raw = make_image_bytes(2)
    with pytest.raises(food11.InvalidImageError):
        food11.preprocess(food11.decode_image_bytes(raw[: len(raw) // 3]))


def test_top_prediction_is_the_argmax_with_its_softmax_probability():
    logits = np.array([[0.0] * 11, [0.0] * 10 + [np.log(10.0)]])
    (label_a, p_a), (label_b, p_b) = food11.top_prediction(logits)
    assert label_a == "Bread" and p_a == pytest.approx(1 / 11)
    assert label_b == "Vegetable/Fruit" and p_b == pytest.approx(10 / 20)


def test_softmax_is_stable_for_large_logits():
    probabilities = food11.softmax(np.array([[1000.0, 999.0, -1000.0]]))
    assert np.isfinite(probabilities).all()
    assert probabilities.sum() == pytest.approx(1.0)
