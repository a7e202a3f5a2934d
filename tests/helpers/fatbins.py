"""Libraries for the build guard (docker/cuda_arch.py), made by the test: minimal ELF64 files whose
`.nv_fatbin` section holds fatbins written here, with and without a target's code."""

from __future__ import annotations

import struct
from pathlib import Path

from servelab import paths
from tests.helpers import file_module

cuda_arch = file_module(paths.REPO_ROOT / "docker" / "cuda_arch.py")
Entry, device_code, main = cuda_arch.Entry, cuda_arch.device_code, cuda_arch.main
ALLOW_LIST = paths.REPO_ROOT / "docker" / "cuda_allow.txt"

PTX, CUBIN = 1, 2
PLAIN = 0x11  # 64-bit, Linux: the flags of an uncompressed entry from nvcc 13
P100 = ["--arch", "6.0"]
CUDA_12_6_ISA = (8, 5)  # the PTX ISA of the node's driver (560, CUDA 12.6), and of Triton 2.51's own PTX
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
