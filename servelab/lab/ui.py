"""Use the GourmetGram web UI as a browser does: upload a photo, read what the result page says."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import requests

from servelab import paths

# GourmetGram's bundled sample photos, which its page offers (gourmetgram/make_samples.py draws them).
SAMPLES_DIR = paths.SAMPLE_IMAGE.parent


@dataclass(frozen=True)
class PageAnswer:
    """What a GourmetGram result page shows (None for what it does not)."""

    status: int
    heading: str | None  # the predicted class, or what went wrong ("No prediction", "That file is too large"...)
    label: str | None  # the predicted class, when the page shows a prediction
    probability: str | None  # as shown, e.g. "23.4% probability"
    answered_by: str | None  # e.g. "answered by triton in 41 ms"
    error: str | None
    banner: str | None  # the weights warning every page carries unless the weights are trained
    backend: str | None  # the page's header: the backend, its address, and the Triton model

    def __str__(self) -> str:
        lines = [f"HTTP {self.status}; label shown: {self.label or '(none)'}"]
        if self.label is None and self.heading:
            lines.append(f"  page heading: {self.heading}")
        for name in ("probability", "answered_by", "backend", "error", "banner"):
            value = getattr(self, name)
            if value:
                lines.append(f"  {name.replace('_', ' ')}: {value}")
        return "\n".join(lines)


def _text(pattern: str, page: str) -> str | None:
    """The text of the first match of `pattern`, without markup and with whitespace collapsed."""
    match = re.search(pattern, page, re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", match.group(1))).split()) if match else None


def read_result_page(status: int, page: str) -> PageAnswer:
    heading = _text(r"<h1>(.*?)</h1>", page)
    probability = _text(r'class="probability">(.*?)</p>', page)
    return PageAnswer(
        status=status,
        heading=heading,
        label=heading if probability else None,
        probability=probability,
        answered_by=_text(r">(answered by .*?)</p>", page),
        error=_text(r'class="error">(.*?)</p>', page),
        banner=_text(r'role="alert">(.*?)</div>', page),
        backend=_text(r'class="backend">(.*?)</span>', page),
    )


def upload(ui_url: str, image_name: str, image: bytes, timeout_s: float = 60) -> PageAnswer:
    """POST a photo to GourmetGram's /predict as its upload form does, and read the result page."""
    page = requests.post(
        f"{ui_url.rstrip('/')}/predict", files={"file": (image_name, image, "image/jpeg")}, timeout=timeout_s
    )
    return read_result_page(page.status_code, page.text)


class GourmetGram(str):
    """The URL of a GourmetGram the lab started (a str, for f-strings and requests), and the upload
    its form makes, as `ui.upload("soup.jpg")`, of any of its `samples()`."""

    @staticmethod
    def samples() -> list[str]:
        """The names of the sample photos GourmetGram offers (gourmetgram/static/samples/)."""
        return sorted(path.name for path in SAMPLES_DIR.glob("*.jpg"))

    def upload(self, image_name: str, image: bytes | None = None) -> PageAnswer:
        """Upload a photo as GourmetGram's form does, and print what the result page says; without
        `image`, the sample photo of that name (gourmetgram/static/samples/). A page that is not a
        prediction (the backend down, say) is an error that quotes the page."""
        if image is None:
            if image_name not in self.samples():
                raise ValueError(
                    f"{image_name!r} is not one of GourmetGram's sample photos ({', '.join(self.samples())}): "
                    "name one of those, or pass your photo's bytes too: upload(name, Path(...).read_bytes())."
                )
            image = (SAMPLES_DIR / image_name).read_bytes()
        answer = upload(self, image_name, image)
        print(answer)
        if answer.status != 200:
            raise RuntimeError(f"GourmetGram at {self} answered HTTP {answer.status}: {answer.error}")
        return answer
