"""The build guard (docker/cuda_arch.py) reads which GPU architectures a library has code for, and
fails a GPU image's build where one has none for its target and the allow list (docker/cuda_allow.txt,
the one list every Dockerfile's guard reads) does not excuse it.

Its libraries are made by the test (tests/helpers/fatbins.py); a Triton image's tree and real
libraries: tests/test_cuda_arch_triton.py.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from servelab import paths
from tests.helpers.fatbins import (
    ALLOW_LIST,
    CUBIN,
    P100,
    PLAIN,
    PTX,
    Entry,
    container,
    cuda_arch,
    device_code,
    elf,
    fatbin_entry,
    guard,
    library,
    main,
    ptx,
)


@pytest.mark.parametrize(
    ("entry", "capability", "driver_isa", "runs"),
    [
        (Entry("sm", 60), (6, 0), (9, 0), True),
        (Entry("sm", 60), (6, 1), (9, 0), True),  # binary compatible forward within a major version
        (Entry("sm", 61), (6, 0), (9, 0), False),  # never backward
        (Entry("sm", 60), (7, 0), (9, 0), False),  # nor across major versions
        (ptx(52), (6, 0), (9, 0), True),  # the driver compiles PTX for a newer GPU
        (ptx(70), (6, 0), (9, 0), False),
        (ptx(120), (12, 1), (9, 0), True),
        (Entry("sm", 100), (10, 3), (9, 0), True),
        (Entry("sm", 100, "a"), (10, 3), (9, 0), False),  # sm_100a: 10.0 only
        (Entry("sm", 90, "a"), (9, 0), (9, 0), True),
        (ptx(100, "f"), (10, 3), (9, 0), True),  # compute_100f: its family, 10.x from 10.0 up
        (ptx(100, "f"), (12, 0), (9, 0), False),  # and no other
        # PTX runs only where the driver compiles its ISA version.
        (ptx(52, isa=(8, 5)), (6, 0), (8, 5), True),  # CUDA 12.5 or 12.6 wrote it: a 560 driver compiles it
        (ptx(52, isa=(8, 8)), (6, 0), (8, 5), False),  # CUDA 12.9 wrote it: newer than the driver, no code
        (ptx(52, isa=(8, 8)), (6, 0), (8, 8), True),  # a CUDA 12.9 driver compiles it
        (ptx(52, isa=(9, 0)), (6, 0), (8, 8), False),
        (Entry("sm", 60), (6, 0), (8, 0), True),  # a cubin is not compiled: any CUDA 12 driver runs it
    ],
    ids=str,
)
def test_what_runs_on_a_compute_capability_under_a_driver(entry, capability, driver_isa, runs):
    assert entry.runs_on(capability, driver_isa) is runs


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
    assert code == 1 and "  libcudnn_cnn.so.9: no code for 6.0 (has sm 75)" in out and "unused     allow" in out


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
