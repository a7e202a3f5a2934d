"""Fetching a photo by URL for a prediction service: the server's side of `{"url": ...}`.

A server that fetches URLs its clients name is a security boundary: without rules, a client could
make it read internal services (Triton's admin API, a cloud metadata endpoint) on its behalf. So:
- only hosts on an allow-list are fetched (IMAGE_URL_ALLOWED_HOSTS: `host` allows any port,
  `host:port` that port only), over http or https, and every redirect is checked again;
- a download is bounded in time (IMAGE_DOWNLOAD_TIMEOUT_S) and in bytes (streamed and counted:
  the same limit as an upload), so a huge or slow file cannot tie up the server;
- every failure is a `DownloadError` carrying the HTTP status the client should get and a message
  that says what to do.

The download is asynchronous I/O on the event loop: while it waits for the network, the server
accepts other requests and runs other inferences.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

# The local lab's image host (servelab/stack/catalogue.py starts it on this port); the Docker stacks set
# IMAGE_URL_ALLOWED_HOSTS to their own image_host service.
DEFAULT_ALLOWED_HOSTS = "127.0.0.1:8400"
MAX_REDIRECTS = 5
DEFAULT_PORTS = {"http": 80, "https": 443}


class DownloadError(Exception):
    """A URL the server will not or could not fetch: `status` is the HTTP status for the client."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class AllowList:
    """The hosts this server fetches images from, as IMAGE_URL_ALLOWED_HOSTS lists them."""

    entries: tuple[tuple[str, int | None], ...]
    text: str

    @classmethod
    def parse(cls, text: str) -> AllowList:
        entries = []
        for item in (part.strip().lower() for part in text.split(",")):
            if not item:
                continue
            host, _, port = item.rpartition(":") if item.count(":") == 1 else (item, "", "")
            if port and not port.isdigit():
                raise ValueError(f"IMAGE_URL_ALLOWED_HOSTS: {item!r} is not `host` or `host:port`.")
            entries.append((host, int(port) if port else None))
        return cls(tuple(entries), text)

    def check(self, url: str) -> None:
        """Raise DownloadError unless `url` is an http(s) URL of an allowed host."""
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise DownloadError(400, f"{url!r} is not a valid URL ({exc}).") from None
        if parts.scheme not in DEFAULT_PORTS:
            raise DownloadError(400, f"Only http and https URLs are fetched, not {parts.scheme or 'no'} scheme.")
        if not parts.hostname:
            raise DownloadError(400, f"{url!r} names no host.")
        if parts.username or parts.password:
            raise DownloadError(400, "URLs with a user name or password are not fetched: remove them from the URL.")
        host, port = parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]
        if (host, None) not in self.entries and (host, port) not in self.entries:
            raise DownloadError(
                403,
                f"This server does not fetch images from {host}:{port}: it is not in IMAGE_URL_ALLOWED_HOSTS "
                f"({self.text or 'empty'}). Send the image itself as base64 in `image`, or use an allowed host.",
            )


async def download(client: httpx.AsyncClient, url: str, allowed: AllowList, max_bytes: int, timeout_s: float) -> bytes:
    """The body at `url`, following at most MAX_REDIRECTS redirects, each checked against `allowed`."""
    try:
        async with asyncio.timeout(timeout_s):
            for _ in range(MAX_REDIRECTS + 1):
                allowed.check(url)
                async with client.stream("GET", url) as response:
                    if response.is_redirect:
                        url = urljoin(url, response.headers.get("location", ""))
                        continue
                    if response.status_code != 200:
                        raise DownloadError(
                            502, f"The image host answered {response.status_code} for {url}: check the URL."
                        )
                    return await _read_bounded(response, url, max_bytes)
            raise DownloadError(502, f"More than {MAX_REDIRECTS} redirects from the image URL: give the final URL.")
    except TimeoutError:
        raise DownloadError(
            504, f"The image at {url} did not arrive within {timeout_s:g} s: try again, or send the image itself."
        ) from None
    except httpx.HTTPError as exc:
        raise DownloadError(502, f"Could not download {url} ({type(exc).__name__}: {exc}).") from None


async def _read_bounded(response: httpx.Response, url: str, max_bytes: int) -> bytes:
    too_large = DownloadError(
        413, f"The image at {url} is larger than {max_bytes} bytes, the limit for an image: use a smaller one."
    )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise too_large
    return bytes(body)
