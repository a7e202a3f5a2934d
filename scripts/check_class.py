"""The instructor's check before class (`make check-class`): what the node's build fetches from
outside the repository is there, so that notebook 2 does not find out in a lease.

- PyTorch: torch and torchvision at requirements.lock's versions, on the index each Dockerfile that
  installs them names (TORCH_INDEX_URL's default: PyTorch's CUDA 12.6 index, a PEP 503 "simple"
  index), as Linux x86_64 wheels for that image's Python: 3.11 where the base is python:3.11-...
  (docker/Dockerfile.torch), 3.10 in Triton 24.10's image (docker/Dockerfile.triton, Ubuntu 22.04).
- The base images: every FROM with a tag, asked of its registry (Docker Hub, nvcr.io, quay.io) by the
  registry HTTP API v2: the tag's manifest, after the anonymous token those registries hand out.

It says what is missing and what to change; exit 0 when everything is there, 1 when something is
missing, 2 when a source could not be reached (nothing is judged there: run it where it can be).

    python3 scripts/check_class.py [--index-url URL] [--registry HOST=URL ...] [--timeout S]

Standard library only: an instructor runs it anywhere, before any virtualenv exists.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILES = ("docker/Dockerfile.*", "*/Dockerfile")
PACKAGES = ("torch", "torchvision")
# The Python of a base image that is not python:X.Y-...: NVIDIA's release notes for Triton 24.10 give
# Ubuntu 22.04, whose Python is 3.10.
PYTHON_OF_BASE = {"nvcr.io/nvidia/tritonserver:24.10-py3": "3.10"}
DOCKER_HUB = "docker.io"
REGISTRY_URLS = {DOCKER_HUB: "https://registry-1.docker.io"}  # any other registry: https://HOST
REGISTRY_NAMES = {DOCKER_HUB: "Docker Hub"}
# A manifest list (several platforms) or a single manifest, in Docker's or OCI's format.
MANIFESTS = ", ".join(
    f"application/vnd.{kind}"
    for kind in (
        "oci.image.index.v1+json",
        "docker.distribution.manifest.list.v2+json",
        "docker.distribution.manifest.v2+json",
        "oci.image.manifest.v1+json",
    )
)


class Unreachable(Exception):
    """The source could not be asked: nothing about it is known."""


# ---- what the repository asks for ----------------------------------------------------------------


def dockerfiles() -> list[Path]:
    return sorted({path for pattern in DOCKERFILES for path in REPO_ROOT.glob(pattern)})


def instructions(path: Path) -> list[tuple[str, str]]:
    """A Dockerfile's instructions, keyword and arguments, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n(\s*#.*\n)*", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def lock_pins(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    lock = (REPO_ROOT / "requirements.lock").read_text()
    return {name: found[1] for name in packages if (found := re.search(rf"^{name}==(\S+)$", lock, re.M))}


def base_images() -> dict[str, list[str]]:
    """Each base a FROM names with a tag (the others: a stage, or the lab's PyTorch image), and the files."""
    bases: dict[str, list[str]] = {}
    for path in dockerfiles():
        for keyword, args in instructions(path):
            if keyword == "FROM" and ":" in (image := args.split()[0]) and not image.startswith("$"):
                bases.setdefault(image, []).append(str(path.relative_to(REPO_ROOT)))
    return bases


@dataclass(frozen=True)
class TorchImage:
    dockerfile: str
    python: str | None  # "3.11"; None where the base's Python is not known here
    index_url: str


def torch_images() -> list[TorchImage]:
    """The Dockerfiles that install PyTorch from an index (ARG TORCH_INDEX_URL), with their Python."""
    images = []
    for path in dockerfiles():
        found = instructions(path)
        index = next((a.split("=", 1)[1] for k, a in found if k == "ARG" and a.startswith("TORCH_INDEX_URL=")), None)
        if index is None:
            continue
        base = next(args.split()[0] for keyword, args in found if keyword == "FROM")
        python = re.match(r"python:(\d+\.\d+)", base)
        version = python[1] if python else PYTHON_OF_BASE.get(base)
        images.append(TorchImage(str(path.relative_to(REPO_ROOT)), version, index.strip('"')))
    return images


# ---- PyTorch's index ------------------------------------------------------------------------------


class Links(HTMLParser):
    """The file names a PEP 503 project page links to."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.files.append(urllib.parse.unquote(urllib.parse.urlsplit(href).path.rsplit("/", 1)[-1]))


def get(
    url: str, timeout_s: float, headers: dict[str, str] | None = None, method: str = "GET"
) -> tuple[int, dict, bytes]:
    """Status, headers and body of a request; Unreachable where no answer came."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()
    except (urllib.error.URLError, OSError) as error:
        raise Unreachable(
            f"cannot reach {urllib.parse.urlsplit(url).netloc}: {getattr(error, 'reason', error)}"
        ) from error


def wheels(index_url: str, package: str, timeout_s: float) -> list[str]:
    status, _, body = get(f"{index_url.rstrip('/')}/{package}/", timeout_s)
    if status == 404:
        return []
    if status != 200:
        raise Unreachable(f"{index_url} answered {status} for {package}")
    links = Links()
    links.feed(body.decode(errors="replace"))
    return [name for name in links.files if name.endswith(".whl")]


def version_for(wheel: str, python: str) -> str | None:
    """The version of a wheel for CPython `python` on Linux x86_64 ("2.14.1+cu126"), None for any other."""
    parts = wheel[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        return None
    tag = f"cp{python.replace('.', '')}"
    platforms = parts[-1].split(".")
    linux = any(p.startswith(("manylinux", "linux")) and p.endswith("_x86_64") for p in platforms)
    return parts[1] if tag in parts[-3].split(".") and linux else None


def release(version: str) -> tuple[int, ...] | None:
    """2.14.1 of 2.14.1+cu126, as numbers; None for a pre-release (2.15.0a0, 2.15.0.dev20260101)."""
    public = version.split("+")[0]
    return tuple(map(int, public.split("."))) if re.fullmatch(r"\d+(\.\d+)*", public) else None


def check_pytorch(images: list[TorchImage], index_override: str, timeout_s: float) -> tuple[list, list, list]:
    """The lines of the report, what to change, and the sources that could not be reached."""
    pins, lines, changes, unreachable = lock_pins(), [], [], []
    for package, pinned in pins.items():
        for image in images:
            index = index_override or image.index_url
            what = f"{package} {pinned} for Python {image.python} ({image.dockerfile}, {index})"
            if image.python is None:
                lines.append(f"  UNKNOWN  {package}: the Python of {image.dockerfile}'s base is not known here")
                changes.append(
                    f"add the Python of {image.dockerfile}'s base to PYTHON_OF_BASE in scripts/check_class.py"
                )
                continue
            try:
                found = {w: v for w in wheels(index, package, timeout_s) if (v := version_for(w, image.python))}
            except Unreachable as error:
                lines.append(f"  UNREACHABLE {what}: {error}")
                unreachable.append(str(error))
                continue
            exact = sorted(w for w, v in found.items() if v.split("+")[0] == pinned)
            if exact:
                lines.append(f"  ok       {what}: {exact[0]}")
                continue
            releases = {v: r for v in found.values() if (r := release(v))}
            newest = max(releases, key=releases.__getitem__, default=None)
            has = f"its newest for cp{image.python.replace('.', '')} is {newest}" if newest else "it has none"
            lines.append(f"  MISSING  {what}: no Linux x86_64 wheel; {has}")
            changes.append(
                f"{package}=={pinned} (requirements.lock) has no wheel for Python {image.python} on {index}, which "
                f"{image.dockerfile} installs from: pin {package} to a release that has one"
                + (f" ({newest.split('+')[0]})" if newest else "")
                + " in pyproject.toml and run `make lock`, or set that Dockerfile's TORCH_INDEX_URL to an index with it"
            )
    return lines, changes, unreachable


# ---- the registries ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageRef:
    registry: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        """Docker's reading of a name: a first part with a dot or a port (or localhost) is the registry,
        else Docker Hub, where a name of one part is an official image (library/NAME)."""
        name, _, tag = image.rpartition(":")
        first, _, rest = name.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            return cls(first, rest, tag)
        return cls(DOCKER_HUB, name if "/" in name else f"library/{name}", tag)


def anonymous_token(challenge: str, repository: str, timeout_s: float) -> str:
    """The token a registry hands anyone for pulling `repository`, from its `WWW-Authenticate: Bearer ...`."""
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    if "realm" not in fields:
        raise Unreachable(f"the registry asks for a login it did not describe ({challenge!r})")
    query = {key: value for key, value in fields.items() if key in ("service", "scope")}
    query.setdefault("scope", f"repository:{repository}:pull")
    status, _, body = get(f"{fields['realm']}?{urllib.parse.urlencode(query)}", timeout_s)
    if status != 200:
        raise Unreachable(f"its token service ({fields['realm']}) answered {status}")
    answer = json.loads(body)
    return answer.get("token") or answer.get("access_token") or ""


def manifest_status(ref: ImageRef, base_url: str, timeout_s: float) -> int:
    """The registry's answer to a HEAD of the tag's manifest: 200 there, 404 not (after the token dance)."""
    url = f"{base_url.rstrip('/')}/v2/{ref.repository}/manifests/{ref.tag}"
    headers = {"Accept": MANIFESTS}
    status, answer_headers, _ = get(url, timeout_s, headers, "HEAD")
    challenge = {key.lower(): value for key, value in answer_headers.items()}.get("www-authenticate", "")
    if status == 401 and challenge.lower().startswith("bearer"):
        headers["Authorization"] = f"Bearer {anonymous_token(challenge, ref.repository, timeout_s)}"
        status, _, _ = get(url, timeout_s, headers, "HEAD")
    return status


def check_bases(registry_urls: dict[str, str], timeout_s: float) -> tuple[list, list, list]:
    lines, changes, unreachable = [], [], []
    for image, files in sorted(base_images().items()):
        ref = ImageRef.parse(image)
        where = f"{image} ({REGISTRY_NAMES.get(ref.registry, ref.registry)}; {', '.join(files)})"
        try:
            status = manifest_status(ref, registry_urls.get(ref.registry, f"https://{ref.registry}"), timeout_s)
        except Unreachable as error:
            lines.append(f"  UNREACHABLE {where}: {error}")
            unreachable.append(str(error))
            continue
        if status == 200:
            lines.append(f"  ok       {where}")
        elif status in (401, 403, 404):
            lines.append(f"  MISSING  {where}: its registry answered {status} for the tag's manifest")
            changes.append(
                f"{image} does not resolve: change the FROM of {', '.join(files)} to a tag its registry has (and "
                "scripts/docker_bases.sh's stand-in name for it)"
            )
        else:
            lines.append(f"  UNREACHABLE {where}: its registry answered {status}")
            unreachable.append(f"{ref.registry} answered {status}")
    return lines, changes, unreachable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 scripts/check_class.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--index-url", default="", help="the package index instead of each Dockerfile's TORCH_INDEX_URL"
    )
    parser.add_argument(
        "--registry",
        action="append",
        default=[],
        metavar="HOST=URL",
        help="where to ask for the images of registry HOST (docker.io, nvcr.io...), e.g. a mirror",
    )
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds to wait for each answer")
    args = parser.parse_args(argv)
    registry_urls = dict(REGISTRY_URLS)
    for pair in args.registry:
        host, _, url = pair.partition("=")
        if not host or not url:
            parser.error(f"--registry {pair!r}: expected HOST=URL")
        registry_urls[host] = url
    print("Before class: what the node's build fetches, asked of where it comes from.")
    print(f"PyTorch at requirements.lock's versions ({', '.join(f'{n}=={v}' for n, v in lock_pins().items())}):")
    torch_lines, torch_changes, torch_unreachable = check_pytorch(torch_images(), args.index_url, args.timeout)
    print("\n".join(torch_lines))
    print("The base images (each FROM with a tag):")
    base_lines, base_changes, base_unreachable = check_bases(registry_urls, args.timeout)
    print("\n".join(base_lines))
    changes, unreachable = torch_changes + base_changes, sorted(set(torch_unreachable + base_unreachable))
    if changes:
        print("What to change:\n" + "\n".join(f"  - {change}" for change in changes))
    if unreachable:
        print(
            "Not judged, because this machine cannot reach them:\n"
            + "\n".join(f"  - {problem}" for problem in unreachable)
            + "\nRun `make check-class` again from a machine that reaches them (the node itself does)."
        )
    if not changes and not unreachable:
        print("Everything the build fetches is there.")
    return 1 if changes else 2 if unreachable else 0


if __name__ == "__main__":
    sys.exit(main())
