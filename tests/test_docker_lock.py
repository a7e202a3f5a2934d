"""What each image installs: the lock's versions (requirements.lock, or docker/triton-py310.lock for
Triton's Python 3.10), or a GPU build named here with why."""

from __future__ import annotations

import re
import shlex

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import lock_pins
from tests.helpers.compose import EXTRAS, REPO_ROOT, arg_defaults, dockerfile_instructions, dockerfiles, variant

# Where an image installs outside the lock, and why (its Dockerfile says so too).
GPU_ONLY = {
    "onnxruntime-gpu": "ONNX Runtime's GPU build: the lock is made on a machine without a GPU",
    "nvidia-cudnn-cu12": "cuDNN 9.10.2, the last with Pascal code, pinned by the Dockerfiles' CUDNN",
}
# The PyTorch step: the lock's torch and torchvision, from the variant's index (cu126, cpu), whose
# builds and dependencies differ from the registry's; numpy 1.x until the image's locked step.
TORCH_STEP = re.compile(r"grep -E '\^\(torch\|torchvision\)==' /src/requirements\.lock > /tmp/torch\.txt")
TORCH_STEP_ARGS = {"${TORCH_INDEX_URL:+--index-url", "$TORCH_INDEX_URL}", "-r", "/tmp/torch.txt", "numpy<2"}
VARIANT_ARGS = {"${ONNXRUNTIME}", "${CUDNN:+$CUDNN}"}  # as the shell sees them, quotes removed
# The one line of the lock an image may leave out: a CUDA build of PyTorch pins its own CUDA runtime.
LEFT_OUT = "grep -v '^nvidia-cuda-runtime-cu12==' /src/requirements.lock > /tmp/constraints.txt"
# Triton's image runs Ubuntu 22.04's Python 3.10: its lock is the lock's versions but where the lock's
# release has no build for 3.10, each named here with why (docker/Dockerfile.triton says so too).
TRITON_LOCK = REPO_ROOT / "docker" / "triton-py310.lock"
OLDER_FOR_PY310 = {
    "pillow": "Pillow 13 needs Python 3.11: 12.3 is its last release for 3.10",
    "onnxruntime": "ONNX Runtime 1.24 and later need Python 3.11: 1.23 is its last release for 3.10",
    "coloredlogs": "onnxruntime 1.23's own dependency (later releases dropped it)",
    "humanfriendly": "coloredlogs' own dependency",
}


def pip_installs(text: str) -> list[list[str]]:
    """The arguments of each `pip install` in a RUN's shell text, up to the end of its command."""
    commands = re.split(r"&&|;|\bthen\b|\belse\b", text)
    return [
        shlex.split(command.split(" install", 1)[1]) for command in commands if re.search(r"\bpip3? install\b", command)
    ]


def packages_named(arguments: list[str]) -> list[str]:
    """What a pip install names to install: its arguments less the options and their values."""
    named, skip = [], False
    for arg in arguments:
        if skip or arg.startswith("-"):
            skip = arg in ("-c", "-r", "--index-url")
            continue
        named.append(arg)
    return named


@pytest.mark.parametrize("image", sorted(dockerfiles()))
def test_every_pip_install_of_an_image_is_at_the_lock_s_versions_or_a_named_variant_build(image):
    extras_seen = []
    for keyword, args in dockerfile_instructions(dockerfiles()[image]):
        if keyword != "RUN":
            continue
        for arguments in pip_installs(args):
            if "--no-deps" in arguments:  # the lab's own package, after its dependencies
                assert packages_named(arguments) in (["/src"], ["."]), arguments
            elif "-r" in arguments:
                assert TORCH_STEP.search(args), f"{image}: -r of anything but the lock's torch lines"
                assert set(arguments) <= TORCH_STEP_ARGS | VARIANT_ARGS, arguments
            else:
                constraint = arguments[arguments.index("-c") + 1] if "-c" in arguments else None
                assert (
                    constraint == "/src/requirements.lock"
                    or (constraint == "/tmp/constraints.txt" and LEFT_OUT in args)
                    or (image == "triton" and constraint == f"/src/{TRITON_LOCK.name}")
                ), f"{image}: `pip install {' '.join(arguments)}` is not constrained by the lock"
                for package in packages_named(arguments):
                    if package in VARIANT_ARGS:
                        continue  # checked below, in each variant
                    extras = re.fullmatch(r"/src\[([a-z,-]+)\]", package)
                    assert extras, f"{image}: installs {package}, not an extra of pyproject.toml"
                    assert set(extras.group(1).split(",")) <= set(EXTRAS), package
                    extras_seen.append(package)
    assert image == "torch" or extras_seen, f"{image}: installs nothing from pyproject.toml"


@pytest.mark.parametrize("cpu", [False, True], ids=["gpu", "cpu"])
def test_the_runtimes_each_variant_picks_are_the_lock_s_or_a_gpu_build_named_with_why(cpu):
    pins = lock_pins()
    for name, service in variant(cpu)["services"].items():
        args = {**arg_defaults(name), **service["build"].get("args", {})}
        for arg in ("ONNXRUNTIME", "CUDNN"):
            if not args.get(arg):
                continue
            requirement = Requirement(args[arg])
            package = canonicalize_name(requirement.name)
            if cpu:
                assert package in pins and not requirement.specifier, f"{name}: {arg}={args[arg]}: the lock pins it"
            else:
                assert package in GPU_ONLY or package in pins, f"{name}: {arg}={args[arg]}"


def test_triton_s_lock_for_python_3_10_is_the_lock_but_for_the_releases_3_10_lacks():
    """docker/triton-py310.lock (`make lock`) may differ from requirements.lock only where the
    lock's release has no build for Python 3.10, and only to an older release."""
    pins, differing = lock_pins(), {}
    for line in TRITON_LOCK.read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            package = canonicalize_name(name)
            if pins.get(package) != Version(version):
                differing[package] = version
                assert package not in pins or Version(version) < pins[package], f"{package}: newer than the lock's"
    assert set(differing) == set(OLDER_FOR_PY310), f"differs from requirements.lock: {differing}; see OLDER_FOR_PY310"
    extra = [canonicalize_name(Requirement(requirement).name) for requirement in EXTRAS["triton"]]
    assert all(package in TRITON_LOCK.read_text() for package in extra), "the `triton` extra, whole: run `make lock`"
