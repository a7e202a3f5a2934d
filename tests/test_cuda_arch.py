"""The build guard (docker/cuda_arch.py) reads which GPU architectures a library has code for, and
fails a GPU image's build where one has none for its target and the allow list (docker/cuda_allow.txt,
the one list every Dockerfile's guard reads) does not excuse it.

Its libraries are made here: minimal ELF64 files whose `.nv_fatbin` section holds fatbins written
by the test, with and without the target's code, and a Triton image's tree laid out as NVIDIA's image
lays it out, checked with the arguments docker/Dockerfile.triton gives the guard. Where nvcc is on the
machine, a kernel it compiles checks the reading against the real format; where this Python has CUDA
13 libraries (the lab's virtualenv), one of them checks that a library built for Turing and newer
fails for the P100; where it has the nvidia-pytriton wheel, its Python backend (Triton 2.51's, the
release docker/Dockerfile.triton builds on) is read as it is.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import site
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from servelab import paths
from tests.helpers import file_module

cuda_arch = file_module(paths.REPO_ROOT / "docker" / "cuda_arch.py")
Entry, device_code, main = cuda_arch.Entry, cuda_arch.device_code, cuda_arch.main
ALLOW_LIST = paths.REPO_ROOT / "docker" / "cuda_allow.txt"

PTX, CUBIN = 1, 2
PLAIN = 0x11  # 64-bit, Linux: the flags of an uncompressed entry from nvcc 13
P100 = ["--arch", "6.0"]
CUDA_12_6_ISA = (8, 5)  # the PTX ISA of the node's driver (560, CUDA 12.6), and of Triton 2.51's own PTX
NODE = ((6, 0), CUDA_12_6_ISA)  # the P100 under that driver
CUBIN_FORMAT = (1, 7)  # what a cubin entry's version holds (read from Triton 2.51's Python backend)


def fatbin_entry(
    kind: int,
    sm: int,
    flags: int = PLAIN,
    payload: bytes = b"\x7fELF code",
    header_size: int = 64,
    isa: tuple[int, int] = CUDA_12_6_ISA,
):
    """One entry: a header laid out as nvcc 13 and cuDNN's write it, then its payload; a PTX entry's
    version is its PTX ISA version (`isa`), a cubin's its format's."""
    major, minor = isa if kind == PTX else CUBIN_FORMAT
    header = struct.pack("<HHIQ8xHHI8xQ16x", kind, 0x0101, header_size, len(payload), minor, major, sm, flags)
    return header.ljust(header_size, b"\0") + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def elf(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 little-endian shared object holding `sections` (with a section-name table)."""
    names = b"\0" + b"".join(name.encode() + b"\0" for name in [*sections, ".shstrtab"])
    data, headers, offset = b"", [struct.pack("<64x")], 64  # section 0 is the null section
    for name, content in [*sections.items(), (".shstrtab", names)]:
        name_at = names.index(b"\0" + name.encode() + b"\0") + 1
        kind = 3 if name == ".shstrtab" else 1  # SHT_STRTAB, SHT_PROGBITS
        headers.append(struct.pack("<IIQQQQIIQQ", name_at, kind, 0, 0, offset + len(data), len(content), 0, 0, 1, 0))
        data += content
    section_offset = 64 + len(data)
    header = b"\x7fELF\x02\x01\x01".ljust(16, b"\0") + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, section_offset, 0, 64, 0, 0, 64, len(headers), len(headers) - 1
    )
    return header + data + b"".join(headers)


def library(folder: Path, name: str, *containers: bytes, padding: bytes = b"") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(elf({".text": b"\x90" * 16, ".nv_fatbin": padding.join(containers)}))
    return path


def guard(capsys, *args: str | Path) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().out


def ptx(sm: int, variant: str = "", isa: tuple[int, int] = CUDA_12_6_ISA, compressed: bool = False) -> Entry:
    return Entry("PTX", sm, variant, compressed, isa)


@pytest.mark.parametrize(
    ("entry", "capability", "runs"),
    [
        (Entry("sm", 60), (6, 0), True),
        (Entry("sm", 60), (6, 1), True),  # binary compatible forward within a major version
        (Entry("sm", 61), (6, 0), False),  # never backward
        (Entry("sm", 60), (7, 0), False),  # nor across major versions
        (ptx(52), (6, 0), True),  # the driver compiles PTX for a newer GPU
        (ptx(70), (6, 0), False),
        (ptx(120), (12, 1), True),
        (Entry("sm", 100), (10, 3), True),
        (Entry("sm", 100, "a"), (10, 3), False),  # sm_100a: 10.0 only
        (Entry("sm", 90, "a"), (9, 0), True),
        (ptx(100, "f"), (10, 3), True),  # compute_100f: its family, 10.x from 10.0 up
        (ptx(100, "f"), (12, 0), False),  # and no other
    ],
    ids=str,
)
def test_what_runs_on_a_compute_capability(entry, capability, runs):
    assert entry.runs_on(capability, (9, 0)) is runs


@pytest.mark.parametrize(
    ("entry", "driver_isa", "runs"),
    [
        (ptx(52, isa=(8, 5)), (8, 5), True),  # CUDA 12.5 or 12.6 wrote it: a 560 driver compiles it
        (ptx(52, isa=(8, 8)), (8, 5), False),  # CUDA 12.9 wrote it: newer than the driver, no code
        (ptx(52, isa=(8, 8)), (8, 8), True),  # a CUDA 12.9 driver compiles it
        (ptx(52, isa=(9, 0)), (8, 8), False),
        (Entry("sm", 60), (8, 0), True),  # a cubin is not compiled: any CUDA 12 driver runs it
    ],
    ids=str,
)
def test_ptx_runs_only_where_the_driver_compiles_its_isa_version(entry, driver_isa, runs):
    assert entry.runs_on((6, 0), driver_isa) is runs


def test_the_node_s_driver_is_cuda_12_6_which_compiles_ptx_isa_8_5():
    assert cuda_arch.NODE_DRIVER_CUDA == (12, 6)
    assert cuda_arch.PTX_ISA_OF_CUDA[cuda_arch.NODE_DRIVER_CUDA] == (8, 5)
    isas = [cuda_arch.PTX_ISA_OF_CUDA[cuda] for cuda in sorted(cuda_arch.PTX_ISA_OF_CUDA)]
    assert isas == sorted(isas), "a newer CUDA never compiles less"


def test_a_cubin_for_the_target_passes(tmp_path, capsys):
    lib = library(tmp_path, "libkernels.so", container(fatbin_entry(CUBIN, 60), fatbin_entry(CUBIN, 70)))
    assert device_code(lib) == {Entry("sm", 60), Entry("sm", 70)}
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 0
    assert "ok         libkernels.so: sm 60 70" in out
    assert "OK: 1 libraries with device code can run on compute capability 6.0 under a CUDA 12.6 driver" in out


def test_cubins_only_for_other_architectures_fail_naming_the_library_and_what_it_has(tmp_path, capsys):
    cubins = container(*(fatbin_entry(CUBIN, sm) for sm in (75, 61, 70)))
    library(tmp_path, "nvidia/cudnn/lib/libcudnn_cnn.so.9", cubins)
    library(tmp_path, "torch/lib/libtorch_cuda.so", container(fatbin_entry(CUBIN, 60)))
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 1
    assert "FAILED for compute capability 6.0 (it runs a cubin sm_60 or PTX up to 60 of PTX ISA 8.5 or older" in out
    assert "1 of 2 libraries with device code cannot run on 6.0:" in out
    assert "  nvidia/cudnn/lib/libcudnn_cnn.so.9: no code for 6.0 (has sm 61 70 75)" in out
    assert "libtorch_cuda.so: no code" not in out
    assert main([*P100, str(tmp_path / "torch")]) == 0  # the good library alone passes


@pytest.mark.parametrize(("sm", "passes"), [(52, True), (60, True), (70, False)])
def test_ptx_at_or_below_the_target_passes_as_the_driver_compiles_it(tmp_path, capsys, sm, passes):
    library(tmp_path, "libjit.so", container(fatbin_entry(PTX, sm, payload=b".version 8.5\0")))
    code, out = guard(capsys, *P100, tmp_path)
    assert (code, f"libjit.so: PTX {sm} (ISA 8.5)" in out) == (0 if passes else 1, True)


def test_ptx_newer_than_the_node_s_driver_is_no_code_unless_the_driver_is_given_as_newer(tmp_path, capsys):
    # compute_52 written by CUDA 12.9 (PTX ISA 8.8): a CUDA 12.6 driver refuses to compile it.
    library(tmp_path, "libnewptx.so", container(fatbin_entry(CUBIN, 75), fatbin_entry(PTX, 52, isa=(8, 8))))
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 1
    assert "  libnewptx.so: no code for 6.0 (has sm 75, PTX 52 (ISA 8.8))" in out
    assert "PTX up to 60 of PTX ISA 8.5 or older, which a CUDA 12.6 driver compiles" in out
    code, out = guard(capsys, *P100, "--driver-cuda", "12.9", tmp_path)
    assert (code, "under a CUDA 12.9 driver" in out) == (0, True)
    assert main([*P100, "--driver-cuda", "12.5", str(tmp_path)]) == 1  # 12.5's ISA is 8.5 too


def test_every_container_counts_whatever_the_padding_between_them(tmp_path):
    first = container(fatbin_entry(CUBIN, 75), fatbin_entry(PTX, 120, payload=b".version"))
    second = container(fatbin_entry(CUBIN, 80, payload=b"odd length"))  # leaves the next one unaligned
    last = container(fatbin_entry(CUBIN, 60))
    lib = library(tmp_path, "libmany.so", first, second, last, padding=b"\0" * 4100)  # past one scan window
    assert device_code(lib) == {Entry("sm", 75), ptx(120), Entry("sm", 80), Entry("sm", 60)}


def test_a_compressed_entry_is_read_from_its_header(tmp_path, capsys):
    lz4, zstd = PLAIN | 0x2000, PLAIN | 0x8000  # CUDA 12's libraries and CUDA 13's
    entries = container(
        fatbin_entry(CUBIN, 60, lz4, payload=os.urandom(300)),
        fatbin_entry(CUBIN, 90, zstd | 0x100000, payload=os.urandom(200), header_size=112),  # sm_90a
        fatbin_entry(PTX, 120, zstd | 0x200000, payload=os.urandom(100), header_size=80),  # compute_120f
    )
    lib = library(tmp_path, "libpacked.so.12", entries)
    assert device_code(lib) == {Entry("sm", 60, "", True), Entry("sm", 90, "a", True), ptx(120, "f", compressed=True)}
    code, out = guard(capsys, *P100, lib)
    assert (code, "libpacked.so.12: sm 60 90a, PTX 120f (ISA 8.5)" in out) == (0, True)


def test_files_without_device_code_are_skipped_and_nothing_to_check_fails(tmp_path, capsys):
    (tmp_path / "libnotelf.so").write_bytes(b"#!/bin/sh\n" * 20)
    (tmp_path / "libhost.so.1").write_bytes(elf({".text": b"\x90" * 64}))
    assert device_code(tmp_path / "libnotelf.so") is None
    assert device_code(tmp_path / "libhost.so.1") is None
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 1
    assert "libnotelf.so" not in out and "libhost.so.1" not in out
    assert "no library with device code under" in out and "nothing checked" in out
    library(tmp_path, "libgpu.so", container(fatbin_entry(CUBIN, 60)))
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 0 and "OK: 1 libraries" in out


def test_only_the_loaded_fatbin_counts_not_relocatable_device_code(tmp_path, capsys):
    lib = tmp_path / "librdc.so"
    sections = {".nv_fatbin": container(fatbin_entry(CUBIN, 75)), "__nv_relfatbin": container(fatbin_entry(CUBIN, 60))}
    lib.write_bytes(elf(sections))
    assert device_code(lib) == {Entry("sm", 75)}
    assert guard(capsys, *P100, lib)[0] == 1


def test_fatbins_a_library_loads_itself_count_where_its_nv_fatbin_has_none(tmp_path, capsys):
    # cuFFT's way: one sm_52 cubin in .nv_fatbin, its kernels as fatbins in a data section.
    by_chance = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 2**40)  # the magic number in other data: no container
    data = b"tables" + by_chance + b"\0" * 10 + container(fatbin_entry(CUBIN, 60), fatbin_entry(8, 50)) + b"more"
    lib = tmp_path / "libcufft.so.11"
    lib.write_bytes(elf({".nv_fatbin": container(fatbin_entry(CUBIN, 52)), ".data": data}))
    assert device_code(lib) == {Entry("sm", 52)}
    assert cuda_arch.embedded_code(lib) == {Entry("sm", 60)}  # kind 8 (in cuFFT) is neither PTX nor a cubin
    code, out = guard(capsys, *P100, lib)
    assert (code, "ok         libcufft.so.11: sm 52; loads itself: sm 60" in out) == (0, True)
    lib.write_bytes(elf({".nv_fatbin": container(fatbin_entry(CUBIN, 52)), ".data": b"tables" + by_chance}))
    code, out = guard(capsys, *P100, lib)
    assert (code, "libcufft.so.11: no code for 6.0 (has sm 52)" in out) == (1, True)


def test_an_allow_entry_excuses_a_library_with_its_reason(tmp_path, capsys):
    library(tmp_path, "cusparselt/lib/libcusparseLt.so.0", container(fatbin_entry(CUBIN, 80)))
    library(tmp_path, "cudnn/lib/libcudnn_ops.so.9", container(fatbin_entry(CUBIN, 60)))
    code, out = guard(capsys, *P100, "--allow", "libcusparseLt.so*=2:4 sparsity on sm_80+ only", tmp_path)
    assert code == 0
    assert "allowed    cusparselt/lib/libcusparseLt.so.0: sm 80" in out
    assert "OK: 2 libraries with device code can run on compute capability 6.0 under a CUDA 12.6 driver; " in out
    assert "cusparselt/lib/libcusparseLt.so.0 allowed: 2:4 sparsity on sm_80+ only" in out


def test_an_allow_that_matches_nothing_says_so_and_the_build_goes_on(tmp_path, capsys):
    library(tmp_path, "libnccl.so.2", container(fatbin_entry(CUBIN, 60)))
    code, out = guard(capsys, *P100, "--allow", "libcusparseLt*=not in this image", tmp_path)
    assert code == 0
    assert "unused     allow 'libcusparseLt*' matches no library with device code here (not in this image)" in out
    assert "OK: 1 libraries with device code" in out
    # One that matches a library with code is used: a build can allow for what a version may lack.
    code, out = guard(capsys, *P100, "--allow", "libnccl*=may lack sm_60 in a later version", tmp_path)
    assert (code, "ok         libnccl.so.2: sm 60" in out, "unused" in out) == (0, True, False)
    # An unused allow excuses nothing else.
    library(tmp_path, "libcudnn_cnn.so.9", container(fatbin_entry(CUBIN, 75)))
    code, out = guard(capsys, *P100, "--allow", "libcusparseLt*=not in this image", tmp_path)
    assert (code, "  libcudnn_cnn.so.9: no code for 6.0 (has sm 75)" in out, "unused     allow" in out) == (
        1,
        True,
        True,
    )


# cuSPARSELt 0.7.1 (nvidia-cusparselt-cu12, pinned by PyTorch's cu126 wheels), as read from that
# wheel's libcusparseLt.so.0: cubins from sm_52 up but none for Pascal, and PTX only of ISA 8.7
# (CUDA 12.8), newer than the node's driver compiles.
CUSPARSELT_0_7_1 = (52, 80, 86, 87, 89, 90, 100, 120)


def test_the_allow_list_excuses_cusparselt_which_has_no_code_for_the_p100(tmp_path, capsys):
    entries = [*(fatbin_entry(CUBIN, sm) for sm in CUSPARSELT_0_7_1), fatbin_entry(CUBIN, 90, PLAIN | 0x100000)]
    entries += [fatbin_entry(PTX, sm, isa=(8, 7)) for sm in CUSPARSELT_0_7_1]
    library(tmp_path, "nvidia/cusparselt/lib/libcusparseLt.so.0", container(*entries))
    library(tmp_path, "nvidia/cudnn/lib/libcudnn_ops.so.9", container(fatbin_entry(CUBIN, 60)))
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 1, "without the allow list, it fails the build"
    assert "  nvidia/cusparselt/lib/libcusparseLt.so.0: no code for 6.0 (has sm 52 80 86 87 89 90 90a 100" in out
    code, out = guard(capsys, *P100, "--allow-file", ALLOW_LIST, tmp_path)
    assert code == 0, out
    why = cuda_arch.read_allow_list(ALLOW_LIST)["libcusparseLt.so*"]
    assert "2:4 structured sparsity" in why and "sm_80" in why
    assert "allowed    nvidia/cusparselt/lib/libcusparseLt.so.0: sm 52 80 86 87 89 90 90a 100 120, PTX " in out
    assert f"nvidia/cusparselt/lib/libcusparseLt.so.0 allowed: {why}" in out
    # The list's other entries match nothing here, and say so.
    assert "unused     allow 'libnvshmem_host.so*' matches no library with device code here" in out
    assert out.count("\nunused     allow ") == len(cuda_arch.read_allow_list(ALLOW_LIST)) - 1


def test_an_allow_list_is_a_glob_then_why_and_a_line_without_a_reason_fails(tmp_path):
    allow_list = tmp_path / "allow.txt"
    allow_list.write_text("# a comment\n\nlibone.so*   one, and why: issue #1\n  libtwo.so  two\n")
    assert cuda_arch.read_allow_list(allow_list) == {"libone.so*": "one, and why: issue #1", "libtwo.so": "two"}
    allow_list.write_text("libone.so*   why\nlibtwo.so\n")
    library(tmp_path, "libgpu.so", container(fatbin_entry(CUBIN, 60)))
    command = [sys.executable, "docker/cuda_arch.py", *P100, "--allow-file", str(allow_list), str(tmp_path)]
    done = subprocess.run(command, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "line 2: 'libtwo.so' says no reason" in done.stderr, done.stderr


def test_a_fatbin_it_cannot_read_fails_the_build(tmp_path, capsys):
    lib = library(tmp_path, "libodd.so", container(fatbin_entry(CUBIN, 60)) + b"\0\0\0\0junk and more")
    code, out = guard(capsys, *P100, tmp_path)
    assert code == 1
    assert "  libodd.so: its device code could not be read (no fatbin container at byte" in out
    assert "UNREADABLE" in out and str(lib) not in out  # named below its root, as every library


def test_only_headers_are_read(tmp_path, monkeypatch):
    payloads = [os.urandom(64 * 1024) for _ in range(8)]
    lib = library(
        tmp_path, "libbig.so", container(*(fatbin_entry(CUBIN, 50 + i, payload=p) for i, p in enumerate(payloads)))
    )
    read = []
    real_open = open

    def counting_open(*args, **kwargs):
        file = real_open(*args, **kwargs)
        real_read = file.read
        file.read = lambda size=-1: read.append(len(chunk := real_read(size))) or chunk
        return file

    monkeypatch.setattr(cuda_arch, "open", counting_open, raising=False)
    assert len(device_code(lib)) == 8
    assert sum(read) < 4096 < lib.stat().st_size // 100  # headers: a few hundred bytes of half a MiB


def test_the_command_line(tmp_path):
    lib = library(tmp_path, "lib/libcuda_code.so", container(fatbin_entry(CUBIN, 61)))
    run = [sys.executable, "docker/cuda_arch.py"]
    for args, code, said in [
        (["--arch", "6.1", str(tmp_path)], 0, "lib/libcuda_code.so: sm 61"),
        (["--arch", "6.0", str(tmp_path)], 1, "lib/libcuda_code.so: no code for 6.0 (has sm 61)"),
        (["--arch", "sm_60", str(tmp_path)], 2, "expected MAJOR.MINOR"),
        (["--arch", "6.0", "--allow", "libcuda_code.so", str(tmp_path)], 2, "expected GLOB=WHY"),
        (["--arch", "6.0", str(tmp_path / "missing")], 2, "no such file or folder"),
        (["--arch", "6.1", "--driver-cuda", "12.7", str(tmp_path)], 2, "expected a CUDA release whose PTX ISA"),
    ]:
        done = subprocess.run([*run, *args], cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert (done.returncode, said in done.stdout + done.stderr) == (code, True), done.stdout + done.stderr
    assert lib.exists()


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
