"""The lab's image host: a stand-in for an object store in another region.

It serves the photos in a folder over HTTP, after an added latency and at a limited bandwidth, so
that a download costs what it would from a remote bucket. The network is emulated: the bytes
travel over 127.0.0.1 (or the Docker network), and the delay is this server waiting on purpose.
Every answer says what was emulated (headers X-Emulated-Latency-Ms and X-Emulated-Bandwidth-Mbps),
and so does /health.

    python server.py --images ../gourmetgram/static/samples --port 8400 --latency-ms 100

GET /images/<name>                      the photo, after the host's latency
GET /images/<name>?latency_ms=250       this request with another latency (the lab's experiments)
GET /images/<name>?bandwidth_mbps=20    ... or another bandwidth (0: unlimited)
GET /health                             the settings, the photos served, and the downloads under way
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import mimetypes
from pathlib import Path

from aiohttp import web

log = logging.getLogger("image_host")
CHUNK_BYTES = 16 * 1024
MAX_LATENCY_MS = 60_000  # a query can slow one request down, not hold a connection forever


def _number(request: web.Request, name: str, default: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}={raw!r} is not a number.") from None
    if not 0 <= value <= MAX_LATENCY_MS:
        raise web.HTTPBadRequest(text=f"{name}={raw} must be between 0 and {MAX_LATENCY_MS}.")
    return value


def create_app(images: Path, latency_ms: float, bandwidth_mbps: float) -> web.Application:
    photos = {path.name: path.read_bytes() for path in sorted(images.iterdir()) if path.is_file()}
    if not photos:
        raise SystemExit(f"{images} holds no files to serve.")
    # Downloads being answered now: a client (a test) can see that a service is fetching an image.
    under_way = {"downloads": 0}

    async def image(request: web.Request) -> web.StreamResponse:
        under_way["downloads"] += 1
        try:
            return await answer(request)
        finally:
            under_way["downloads"] -= 1

    async def answer(request: web.Request) -> web.StreamResponse:
        body = photos.get(request.match_info["name"])
        if body is None:
            raise web.HTTPNotFound(text=f"No image {request.match_info['name']!r}; this host has: {', '.join(photos)}")
        latency = _number(request, "latency_ms", latency_ms)
        bandwidth = _number(request, "bandwidth_mbps", bandwidth_mbps)
        await asyncio.sleep(latency / 1000)
        response = web.StreamResponse(
            headers={
                "Content-Type": mimetypes.guess_type(request.match_info["name"])[0] or "application/octet-stream",
                "Content-Length": str(len(body)),
                "X-Emulated-Latency-Ms": f"{latency:g}",
                "X-Emulated-Bandwidth-Mbps": f"{bandwidth:g}" if bandwidth else "unlimited",
            }
        )
        await response.prepare(request)
        for start in range(0, len(body), CHUNK_BYTES):
            chunk = body[start : start + CHUNK_BYTES]
            await response.write(chunk)
            if bandwidth:
                await asyncio.sleep(len(chunk) * 8 / (bandwidth * 1e6))
        await response.write_eof()
        return response

    async def health(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "ready",
                "emulated_latency_ms": latency_ms,
                "emulated_bandwidth_mbps": bandwidth_mbps or "unlimited",
                "images": {name: len(body) for name, body in photos.items()},
                "downloads_under_way": under_way["downloads"],
            }
        )

    app = web.Application()
    app.router.add_get("/images/{name}", image)
    app.router.add_get("/health", health)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=Path, default=Path(__file__).parent / "images")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--latency-ms", type=float, default=100.0, help="added before every answer")
    parser.add_argument("--bandwidth-mbps", type=float, default=0.0, help="0: unlimited")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.info(
        "serving %s on %s:%d, emulated latency %g ms, bandwidth %s",
        args.images,
        args.host,
        args.port,
        args.latency_ms,
        f"{args.bandwidth_mbps:g} Mbit/s" if args.bandwidth_mbps else "unlimited",
    )
    web.run_app(
        create_app(args.images, args.latency_ms, args.bandwidth_mbps),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
