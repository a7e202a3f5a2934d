"""The build guard (docker/cuda_arch.py) on a Triton image's tree laid out as NVIDIA's image lays it
out, checked with the arguments docker/Dockerfile.triton gives the guard, and on real libraries:
where nvcc is on the machine, a kernel it compiles checks the reading against the real format; where
this Python has CUDA 13 libraries (the lab's virtualenv), one of them checks that a library built
for Turing and newer fails for the P100; where it has the nvidia-pytriton wheel, its Python backend
(Triton 2.51's, the release docker/Dockerfile.triton builds on) is read as it is."""

from __future__ import annotations

import re
import shlex
import shutil
import site
import subprocess
from pathlib import Path

import pytest

from servelab import paths
from tests.helpers.fatbins import (
    ALLOW_LIST,
    CUBIN,
    CUDA_12_6_ISA,
    P100,
    PTX,
    container,
    cuda_arch,
    device_code,
    elf,
    fatbin_entry,
    guard,
    library,
)


def nvcc() -> str | None:
    return shutil.which("nvcc") or next((str(p) for p in Path("/usr/local").glob("cuda*/bin/nvcc")), None)


@pytest.mark.skipif(nvcc() is None, reason="no nvcc on this machine: the synthetic fatbins above cover the format")
def test_a_library_nvcc_compiles_is_read_exactly(tmp_path, capsys):
    source = tmp_path / "add_one.cu"
    source.write_text("__global__ void add_one(float *x) { x[threadIdx.x] += 1.0f; }\n")
    lib = tmp_path / "libadd_one.so"
    gencode = ["-gencode", "arch=compute_75,code=sm_75", "-gencode", "arch=compute_80,code=compute_80"]
    compiled = subprocess.run(
        [nvcc(), "-shared", "-Xcompiler", "-fPIC", *gencode, "-o", str(lib), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compiled.returncode == 0, compiled.stderr
    assert {(e.kind, e.sm) for e in device_code(lib)} == {("sm", 75), ("PTX", 80)}
    version = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, timeout=60).stdout
    release = tuple(map(int, re.search(r"release (\d+)\.(\d+)", version).groups()))
    if release not in cuda_arch.PTX_ISA_OF_CUDA:
        pytest.skip(f"nvcc {release}: its PTX ISA version is not in cuda_arch.PTX_ISA_OF_CUDA")
    (written,) = [e for e in device_code(lib) if e.kind == "PTX"]
    assert written.isa == cuda_arch.PTX_ISA_OF_CUDA[release]  # the header's version is the PTX's `.version`
    assert f".version {written.isa[0]}.{written.isa[1]}".encode() in lib.read_bytes() or written.compressed
    driver = ["--driver-cuda", "{}.{}".format(*release)]  # a driver of nvcc's own release
    results = {arch: guard(capsys, "--arch", arch, *driver, lib)[0] for arch in ("6.0", "7.0", "7.5", "8.6")}
    assert results == {"6.0": 1, "7.0": 1, "7.5": 0, "8.6": 0}  # 8.6: the driver compiles the PTX for 8.0
    if written.isa > cuda_arch.PTX_ISA_OF_CUDA[cuda_arch.NODE_DRIVER_CUDA]:  # newer than the node's driver
        assert guard(capsys, "--arch", "8.6", lib)[0] == 1


def venv_cudnn() -> Path | None:
    """cuDNN from a CUDA 13 install in this Python (nvidia-cudnn-cu13, beside nvidia/cu13), if there is one."""
    for folder in map(Path, site.getsitepackages()):
        if (folder / "nvidia" / "cu13").is_dir() and (lib := folder / "nvidia/cudnn/lib/libcudnn_cnn.so.9").exists():
            return lib
    return None


@pytest.mark.skipif(venv_cudnn() is None, reason="no CUDA 13 cuDNN in this Python: the synthetic fatbins cover it")
def test_a_real_cuda_13_library_has_no_code_for_the_p100(capsys):
    # CUDA 13 builds for Turing (sm_75) and newer only, so none of its libraries can run on a Pascal GPU.
    lib = venv_cudnn()
    cubins = {e.sm for e in device_code(lib) if e.kind == "sm"}
    assert 75 in cubins and min(cubins) >= 75
    assert guard(capsys, *P100, lib)[0] == 1
    assert guard(capsys, "--arch", "7.5", lib)[0] == 0


# ---- a Triton image's tree, as docker/Dockerfile.triton's first guard scans it -----------------

# Triton's onnxruntime backend builds ONNX Runtime for these (onnxruntime_backend's
# tools/gen_ort_dockerfile.py, x86_64): CMake makes a cubin and PTX of each.
ORT_CUDA_ARCHS = {"24.10": (60, 61, 70, 75, 80, 86, 90), "24.12": (75, 80, 86, 90)}
# Triton 2.51's Python backend, as read from nvidia-pytriton 0.7.0's libtriton_python.so.
PYTHON_BACKEND_CUBINS = (53, 60, 62, 70, 72, 75, 80, 86, 89, 90)


def kernels(cubins: tuple[int, ...], ptx: tuple[int, ...] = ()) -> bytes:
    return container(*(fatbin_entry(CUBIN, sm) for sm in cubins), *(fatbin_entry(PTX, sm) for sm in ptx))


def host_code(folder: Path, name: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(elf({".text": b"\x90" * 32}))
    return path


def triton_tree(root: Path, ort_archs: tuple[int, ...], python_cubins: tuple[int, ...] = PYTHON_BACKEND_CUBINS):
    """/opt/tritonserver as NVIDIA's image lays it out, under `root`: the backends the lab loads,
    one it never loads (TensorRT's, built for newer GPUs), and the server's own libraries (host code,
    as 2.51's libtritonserver.so is)."""
    tree = root / "opt" / "tritonserver"
    library(tree / "backends/python", "libtriton_python.so", kernels(python_cubins, ptx=(53,)))
    onnxruntime = tree / "backends/onnxruntime"
    library(onnxruntime, "libonnxruntime_providers_cuda.so", kernels(ort_archs, ptx=ort_archs))
    for name in ("libonnxruntime.so.1", "libonnxruntime_providers_shared.so", "libtriton_onnxruntime.so"):
        host_code(onnxruntime, name)
    (onnxruntime / "libonnxruntime.so").symlink_to("libonnxruntime.so.1")
    library(tree / "backends/tensorrt", "libtriton_tensorrt.so", kernels((75, 80, 86, 89, 90)))
    host_code(tree / "lib", "libtritonserver.so")
    return tree


def dockerfile_triton_guard(tree: Path) -> list[str]:
    """The arguments docker/Dockerfile.triton's first guard gives cuda_arch.py, for the GPU the
    image is built for (CUDA_ARCH's default), with /opt/tritonserver moved to `tree` and the allow
    list bound where the Dockerfile binds it."""
    text = (paths.REPO_ROOT / "docker" / "Dockerfile.triton").read_text().replace("\\\n", " ")
    default_arch = re.search(r"^ARG CUDA_ARCH=(\S+)$", text, re.M).group(1)
    run = next(line for line in text.splitlines() if line.startswith("RUN") and "/opt/tritonserver/" in line)
    args = shlex.split(run.split("python3 /tmp/cuda_arch.py", 1)[1].split(";", 1)[0])
    where = {"$CUDA_ARCH": default_arch, "/opt/tritonserver": str(tree), "/tmp/cuda_allow.txt": str(ALLOW_LIST)}
    for bound, here in where.items():
        args = [arg.replace(bound, here) for arg in args]
    return args


def test_the_triton_guard_passes_24_10_s_backends(tmp_path, capsys):
    tree = triton_tree(tmp_path, ORT_CUDA_ARCHS["24.10"])
    code, out = guard(capsys, *dockerfile_triton_guard(tree))
    assert code == 0, out
    assert "ok         python/libtriton_python.so: sm 53 60 62 70 72 75 80 86 89 90, PTX 53 (ISA 8.5)" in out
    assert "ok         onnxruntime/libonnxruntime_providers_cuda.so: sm 60 61 70 75 80 86 90" in out
    assert f"none       {tree / 'lib'}: no library with device code" in out
    assert "tensorrt" not in out, "a backend the lab never loads is not scanned"
    assert "OK: 2 libraries with device code can run on compute capability 6.0 under a CUDA 12.6 driver" in out


def test_the_triton_guard_fails_24_12_s_onnxruntime_backend_naming_it(tmp_path, capsys):
    tree = triton_tree(tmp_path, ORT_CUDA_ARCHS["24.12"])
    code, out = guard(capsys, *dockerfile_triton_guard(tree))
    assert code == 1
    assert "1 of 2 libraries with device code cannot run on 6.0:" in out
    has = "sm 75 80 86 90, PTX 75 80 86 90 (ISA 8.5)"
    assert f"  onnxruntime/libonnxruntime_providers_cuda.so: no code for 6.0 (has {has})" in out


@pytest.mark.parametrize(
    ("ptx_isa", "has"),
    [((8, 5), "sm 75 80 90, PTX 75 (ISA 8.5)"), ((8, 8), "sm 75 80 90, PTX 53 (ISA 8.8)")],
    ids=["ptx-for-turing", "ptx-newer-than-the-driver"],
)
def test_the_triton_guard_fails_a_python_backend_without_code_the_node_runs(tmp_path, capsys, ptx_isa, has):
    tree = triton_tree(tmp_path, ORT_CUDA_ARCHS["24.10"])
    ptx_sm = 75 if ptx_isa == CUDA_12_6_ISA else 53
    entries = [*(fatbin_entry(CUBIN, sm) for sm in (75, 80, 90)), fatbin_entry(PTX, ptx_sm, isa=ptx_isa)]
    (tree / "backends/python/libtriton_python.so").write_bytes(elf({".nv_fatbin": container(*entries)}))
    code, out = guard(capsys, *dockerfile_triton_guard(tree))
    assert (code, f"  python/libtriton_python.so: no code for 6.0 (has {has})" in out) == (1, True)


def pytriton_python_backend() -> Path | None:
    """Triton 2.51's own Python backend, in the nvidia-pytriton wheel (the lab's virtualenv has it)."""
    for folder in map(Path, site.getsitepackages()):
        if (lib := folder / "pytriton/tritonserver/backends/python/libtriton_python.so").exists():
            return lib
    return None


@pytest.mark.skipif(pytriton_python_backend() is None, reason="no nvidia-pytriton here: the tree above stands for it")
def test_triton_2_51_s_own_python_backend_has_pascal_code(tmp_path, capsys):
    lib = pytriton_python_backend()
    entries = device_code(lib)
    assert {e.sm for e in entries if e.kind == "sm"} == set(PYTHON_BACKEND_CUBINS)
    assert {(e.sm, e.isa) for e in entries if e.kind == "PTX"} == {(53, CUDA_12_6_ISA)}  # CUDA 12.6 wrote it
    tree = triton_tree(tmp_path, ORT_CUDA_ARCHS["24.10"])
    (tree / "backends/python/libtriton_python.so").unlink()
    (tree / "backends/python/libtriton_python.so").symlink_to(lib)
    assert guard(capsys, *dockerfile_triton_guard(tree))[0] == 0
