"""A build guard: every CUDA library an image installs has code the GPU it targets can run.

A GPU image can build fine and still fail on its GPU at the first kernel: cuDNN 9.11 and later
carry no code for Pascal (the lab's P100s, compute capability 6.0), and nothing says so until a
convolution runs. The code a shared library carries for the GPU sits in its `.nv_fatbin` section:
fatbin containers, each a list of entries whose headers name a cubin (machine code for one `sm_XY`)
or PTX (for `compute_XY`, which the driver compiles for the GPU at load). A GPU of compute
capability X.Y runs a cubin of the same major version X and a minor version up to Y, and PTX of any
version up to X.Y, where the driver can compile it: a driver compiles PTX of its own CUDA release's
PTX ISA version or older, and refuses newer PTX (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), so PTX that a
newer CUDA wrote is no code for that GPU either. A library with neither has no code for it.

    python docker/cuda_arch.py --arch 6.0 [--driver-cuda 12.6] [--allow-file docker/cuda_allow.txt]
                               [--allow 'GLOB=why' ...] [PATH ...]

checks every `*.so*` under PATH (files or folders; by default this Python's site-packages), prints
what each library with device code carries, and exits 1 naming each library with no code for the
architecture, unless an allow (a file-name glob and the reason) excuses it: a line of the allow list
(--allow-file: docker/cuda_allow.txt, the one list every Dockerfile's guard reads) or an --allow. An
allow that matches no library with device code is said, and fails nothing: one list serves every
image, and each image installs some of what it names. Only headers are read (the libraries are
hundreds of MB), except in a library whose `.nv_fatbin` has no code for the target: the rest of it
is searched for fatbins it loads itself (cuFFT keeps its kernels so).

Standard library only: it runs at build time in every GPU image, before anything else is installed.
"""

from __future__ import annotations

import argparse
import fnmatch
import mmap
import os
import re
import site
import struct
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

FATBIN_MAGIC = 0xBA55ED50
CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries after the header
# An entry header, as far as it is read (real ones are 64 to 184 bytes; read from cuDNN, cuBLAS and nvcc's own):
# kind (1 PTX, 2 cubin) u16 @0, header size u32 @4, payload size u64 @8, version minor u16 @24 and major
# u16 @26, sm u32 @28, flags u64 @40. A PTX entry's version is its PTX ISA version: the `.version` its
# text opens with (checked on libtriton_python.so of Triton 2.51, 8.5, and CUDA 13 libraries, 9.0); a
# cubin's is its format's (1.7, 1.8).
ENTRY = struct.Struct("<HxxIQ8xHHI8xQ16x")
KIND_PTX, KIND_CUBIN = 1, 2
# Compressed payloads: CUDA 12's libraries set 0x2000, CUDA 13's 0x8000 (their payloads start with zstd's magic).
FLAG_COMPRESSED = 0x2000 | 0x8000
# Targets with suffixes, as nvcc 13 marks them (-gencode ...code=sm_90a, ...code=compute_120f):
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a: for that compute capability only
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_120f, compute_120f: for its family (same major version, minor up from it)
SCAN_WINDOW = 4096  # bytes read at a time while skipping the zeros that align one container after another

# The newest PTX ISA version each CUDA release compiles, its driver included (NVIDIA's PTX ISA release
# notes: 12.5 brought 8.5, 12.6 none; there was no 12.7 release).
PTX_ISA_OF_CUDA = {
    **{(11, minor): (7, minor) for minor in range(9)},
    **{(12, minor): (8, minor) for minor in range(6)},
    (12, 6): (8, 5),
    (12, 8): (8, 7),
    (12, 9): (8, 8),
    (13, 0): (9, 0),
}
# The driver of the lab's node: Chameleon's CC-Ubuntu24.04-CUDA image installs nvidia-driver-560, a
# CUDA 12.6 driver (ChameleonCloud/CC-Images, elements/cuda/package-installs.yaml). It runs cubins of
# any CUDA 12 (minor version compatibility), but PTX only up to CUDA 12.6's ISA version, 8.5.
NODE_DRIVER_CUDA = (12, 6)


class FatbinError(ValueError):
    """A `.nv_fatbin` section this reader does not understand: the guard cannot vouch for the library."""


@dataclass(frozen=True, order=True)
class Entry:
    kind: str  # "sm" (a cubin) or "PTX"
    sm: int  # 60 for sm_60 or compute_60; 100 for sm_100
    variant: str = ""  # "a" (arch-specific) or "f" (family-specific), as in sm_90a and compute_120f
    compressed: bool = False
    isa: tuple[int, int] = (0, 0)  # PTX: its PTX ISA version, (8, 5) for `.version 8.5`; cubins: (0, 0)

    def runs_on(self, arch: tuple[int, int], ptx_isa: tuple[int, int]) -> bool:
        """Whether a GPU of compute capability `arch` runs it, under a driver that compiles PTX up to
        `ptx_isa` (the PTX ISA version of the driver's CUDA release)."""
        major, minor = arch
        entry_major, entry_minor = divmod(self.sm, 10)
        if self.kind == "PTX" and self.isa > ptx_isa:
            return False  # written by a newer CUDA than the driver's: it refuses to compile it
        if self.variant == "a":
            return (entry_major, entry_minor) == (major, minor)
        if self.kind == "PTX" and self.variant != "f":  # the driver compiles it for any GPU at or above it
            return (entry_major, entry_minor) <= (major, minor)
        return entry_major == major and entry_minor <= minor  # cubins: forward within a major version only

    def __str__(self) -> str:
        return f"{self.sm}{self.variant}"


def elf_sections(file: BinaryIO) -> dict[str, tuple[int, int]] | None:
    """Offset and size of each section with content in an ELF64 little-endian file; None for any other file."""
    header = file.read(64)
    if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        return None  # not ELF, or not 64-bit little-endian: no CUDA library for x86_64 or aarch64
    (table_offset,) = struct.unpack_from("<Q", header, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", header, 0x3A)
    if table_offset == 0 or entry_size < 64:
        return {}  # no section headers
    file.seek(table_offset)
    first = file.read(64)
    if count == 0:  # more than 0xff00 sections: the count is in section 0's size, the names' index in its link
        (count,) = struct.unpack_from("<Q", first, 32)
    if names_index == 0xFFFF:
        (names_index,) = struct.unpack_from("<I", first, 40)
    file.seek(table_offset)
    table = file.read(entry_size * count)
    if len(table) < entry_size * count or names_index >= count:
        raise FatbinError("section headers cut short")
    # name, type, flags, address, offset, size: of each section
    headers = [struct.unpack_from("<IIQQQQ", table, index * entry_size) for index in range(count)]
    file.seek(headers[names_index][4])
    names = file.read(headers[names_index][5])
    return {
        names[name : names.index(b"\0", name)].decode(errors="replace"): (offset, size)
        for name, kind, _flags, _address, offset, size in headers
        if kind != 8  # SHT_NOBITS: nothing in the file
    }


def next_container(file: BinaryIO, position: int, end: int) -> int | None:
    """Where the next container starts, at or after `position`: there, or past the zeros that align it."""
    while position < end:
        file.seek(position)
        head = file.read(min(CONTAINER.size, end - position))
        if len(head) == CONTAINER.size and CONTAINER.unpack(head)[0] == FATBIN_MAGIC:
            return position
        if head[:1] != b"\0":
            raise FatbinError(f"no fatbin container at byte {position} of the file: {head[:8].hex()}")
        file.seek(position)
        window = file.read(min(SCAN_WINDOW, end - position))
        position += len(window) - len(window.lstrip(b"\0"))  # to the first byte that is not padding
    return None


def read_container(read: Callable[[int, int], bytes], position: int, limit: int) -> tuple[set[Entry], int]:
    """The cubins and PTX of the container at `position` (`read(offset, size)` reads the file), and its end."""
    _, _, header_size, size = CONTAINER.unpack(read(position, CONTAINER.size))
    entry, end = position + header_size, position + header_size + size
    if header_size < CONTAINER.size or end > limit:
        raise FatbinError(f"fatbin container at byte {position} runs past its section")
    entries = set()
    while entry < end:
        raw = read(entry, ENTRY.size)
        if len(raw) < ENTRY.size:
            raise FatbinError(f"fatbin entry at byte {entry} cut short")
        kind, entry_header_size, payload_size, version_minor, version_major, sm, flags = ENTRY.unpack(raw)
        if entry_header_size < ENTRY.size or entry + entry_header_size + payload_size > end:
            raise FatbinError(f"fatbin entry at byte {entry} runs past its container")
        if kind in (KIND_PTX, KIND_CUBIN):  # other kinds (cuFFT's 8, neither of these) are not counted
            name = "PTX" if kind == KIND_PTX else "sm"
            variant = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            isa = (version_major, version_minor) if kind == KIND_PTX else (0, 0)
            entries.add(Entry(name, sm, variant, bool(flags & FLAG_COMPRESSED), isa))
        entry += entry_header_size + payload_size
    return entries, end


def device_code(path: Path) -> set[Entry] | None:
    """The cubins and PTX in a library's `.nv_fatbin`, from their headers alone; None where it has none.

    `__nv_relfatbin` does not count: it holds relocatable device code kept for a later device link
    (nvcc -rdc), not what the CUDA runtime loads. A library linked that way has its loaded code in
    `.nv_fatbin` as well (an -rdc build of nvcc 13 has both), and cuobjdump too lists the
    relocatable code only where a file has no executable code. Counting it could vouch for an
    architecture that the loaded code lacks."""
    with open(path, "rb", buffering=0) as file:  # unbuffered: each read fetches a header, not the payload after it
        sections = elf_sections(file)
        if not sections or ".nv_fatbin" not in sections:
            return None

        def read(offset: int, size: int) -> bytes:
            file.seek(offset)
            return file.read(size)

        position, size = sections[".nv_fatbin"]
        section_end, entries = position + size, set()
        while (start := next_container(file, position, section_end)) is not None:
            found, position = read_container(read, start, section_end)
            entries |= found
    return entries or None


def embedded_code(path: Path) -> set[Entry]:
    """The cubins and PTX a library keeps outside its `.nv_fatbin`, to load them itself: cuFFT keeps its
    kernels so (cuFFT 11.3 and 11.4: thousands of fatbins in a data section, sm_60 among them, and one sm_52
    cubin in `.nv_fatbin`), CUPTI and cuBLASLt some of theirs. They are found by their magic number, so this
    reads the whole file: the guard asks only where a library's `.nv_fatbin` has no code for the target."""
    magic, entries = struct.pack("<I", FATBIN_MAGIC), set()
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        sections = elf_sections(file) or {}
        # Both fatbin sections were read already, or are left out on purpose (device_code says why).
        skipped = [range(o, o + n) for name, (o, n) in sections.items() if name in (".nv_fatbin", "__nv_relfatbin")]
        position = 0
        while (found := data.find(magic, position)) >= 0:
            position = found + len(magic)
            if inside := next((r for r in skipped if found in r), None):
                position = inside.stop
                continue
            try:
                more, position = read_container(lambda offset, size: data[offset : offset + size], found, len(data))
            except (FatbinError, struct.error):
                continue  # the magic number by chance, in other data
            entries |= more
    return entries


def describe(entries: Iterable[Entry]) -> str:
    """`sm 50 60 70 90 90a, PTX 90 120f (ISA 8.8)`: the cubins' architectures, then the PTX's, each
    group of them followed by the PTX ISA version they were written in."""
    entries = sorted(entries)
    cubins = " ".join(dict.fromkeys(str(e) for e in entries if e.kind == "sm"))
    by_isa: dict[tuple[int, int], list[str]] = {}
    for entry in sorted((e for e in entries if e.kind == "PTX"), key=lambda e: (e.isa, e.sm, e.variant)):
        names = by_isa.setdefault(entry.isa, [])
        if str(entry) not in names:
            names.append(str(entry))
    ptx = " ".join(f"{' '.join(names)} (ISA {major}.{minor})" for (major, minor), names in by_isa.items())
    return ", ".join(part for part in (cubins and f"sm {cubins}", ptx and f"PTX {ptx}") if part)


def libraries(roots: list[Path]) -> Iterator[tuple[str, Path]]:
    """Each shared library under `roots` once (links to one file count once), named by its path below its
    root, or below the root's parent where there are several roots (so that each name says which)."""
    seen = set()
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*.so*") if p.is_file())
        base = root.parent if root.is_file() or len(roots) > 1 else root
        for path in files:
            if (real := os.path.realpath(path)) not in seen:
                seen.add(real)
                yield str(path.relative_to(base)), path


def runs(entries: set[Entry], arch: tuple[int, int], ptx_isa: tuple[int, int]) -> bool:
    return any(entry.runs_on(arch, ptx_isa) for entry in entries)


def check(
    roots: list[Path],
    arch: tuple[int, int],
    allows: dict[str, str],
    driver_cuda: tuple[int, int] = NODE_DRIVER_CUDA,
) -> int:
    """Print what each library with device code carries, then what is missing; 0 when each one can run on
    `arch` under a driver of CUDA `driver_cuda` or is excused, 1 otherwise (a library without code, nothing
    to check). An allow that matches no library is said in a line of its own, and fails nothing."""
    major, minor = arch
    target = f"{major}.{minor}"
    ptx_isa = PTX_ISA_OF_CUDA[driver_cuda]
    checked, failures = 0, []
    excused: dict[str, list[str]] = {}  # an --allow's glob: the libraries it excused
    matched: set[str] = set()  # the globs that match a library with device code, whether it needed excusing or not
    with_code: set[Path] = set()  # the roots with a library with device code
    for name, path in libraries(roots):
        try:
            entries = device_code(path)
            if entries is None:
                continue  # no device code: nothing the GPU runs
            own = set() if runs(entries, arch, ptx_isa) else embedded_code(path)
        except (ValueError, struct.error, OSError) as error:  # FatbinError, or headers that point nowhere
            verdict, has, problem = "UNREADABLE", str(error), f"its device code could not be read ({error})"
        else:
            has = describe(entries) + (f"; loads itself: {describe(own)}" if own else "")
            verdict = "ok" if runs(entries | own, arch, ptx_isa) else "NO CODE"
            problem = f"no code for {target} (has {has})"
        checked += 1
        glob = next((glob for glob in allows if fnmatch.fnmatchcase(path.name, glob)), None)
        if glob is not None:
            matched.add(glob)
        if verdict != "ok" and glob is not None:
            verdict = "allowed"
            excused.setdefault(glob, []).append(name)
        elif verdict != "ok":
            failures.append(f"  {name}: {problem}")
        print(f"{verdict:<10} {name}: {has}")
        with_code.add(next(root for root in roots if root == path or root in path.parents))
    for root in roots:
        if root not in with_code:  # a folder of host code alone: nothing for the GPU to run, nothing to check
            print(f"{'none':<10} {root}: no library with device code")
    for glob, why in allows.items():
        if glob not in matched:  # this image does not install it: nothing to excuse here
            print(f"{'unused':<10} allow {glob!r} matches no library with device code here ({why})")
    if checked == 0:
        print(f"cuda_arch: FAILED: no library with device code under {', '.join(map(str, roots))}: nothing checked")
        return 1
    if failures:
        cubins = f"sm_{major}0" + (f" to sm_{major}{minor}" if minor else "")
        driver = f"{driver_cuda[0]}.{driver_cuda[1]}"
        print(
            f"cuda_arch: FAILED for compute capability {target} (it runs a cubin {cubins} or PTX up to {major}{minor}"
            f" of PTX ISA {ptx_isa[0]}.{ptx_isa[1]} or older, which a CUDA {driver} driver compiles):"
        )
        print(f"{len(failures)} of {checked} libraries with device code cannot run on {target}:")
        print("\n".join(failures))
        return 1
    allowed = "".join(f"; {', '.join(names)} allowed: {allows[glob]}" for glob, names in excused.items())
    print(
        f"cuda_arch: OK: {checked} libraries with device code can run on compute capability {target} under a CUDA "
        f"{driver_cuda[0]}.{driver_cuda[1]} driver{allowed}"
    )
    return 0


def site_packages() -> list[Path]:
    """This Python's site-packages folders that exist, none inside another."""
    folders = sorted(
        {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()] if Path(p).is_dir()}
    )
    return [f for f in folders if not any(other in f.parents for other in folders)]


def read_allow_list(path: Path) -> dict[str, str]:
    """An allow list: a line per library, its file-name glob, then (after spaces) why it may lack code for
    the target; a line that starts with `#` is a comment. ValueError names a line with no reason."""
    allows = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        glob, _, why = line.strip().partition(" ")
        if not why.strip():
            raise ValueError(f"{path}, line {number}: {glob!r} says no reason (a glob, spaces, then why)")
        allows[glob] = why.strip()
    return allows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docker/cuda_arch.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", required=True, help="the target GPU's compute capability, e.g. 6.0 for a P100")
    parser.add_argument(
        "--driver-cuda",
        default="{}.{}".format(*NODE_DRIVER_CUDA),
        help="the CUDA release of the target's driver (nvidia-smi's 'CUDA Version'), which limits the PTX it "
        "compiles; default: the lab's node, driver 560 of Chameleon's CC-Ubuntu24.04-CUDA image",
    )
    parser.add_argument(
        "--allow",
        action="append",
        default=[],
        metavar="GLOB=WHY",
        help="excuse the libraries whose file name matches GLOB, for the reason WHY",
    )
    parser.add_argument(
        "--allow-file",
        type=Path,
        metavar="PATH",
        help="an allow list: a line per library, its file-name glob then why (docker/cuda_allow.txt)",
    )
    parser.add_argument("paths", nargs="*", type=Path, help="files or folders (default: site-packages)")
    args = parser.parse_args(argv)
    if not (match := re.fullmatch(r"(\d+)\.(\d)", args.arch)):
        parser.error(f"--arch {args.arch!r}: expected MAJOR.MINOR, e.g. 6.0")
    driver = re.fullmatch(r"(\d+)\.(\d+)", args.driver_cuda)
    driver_cuda = (int(driver[1]), int(driver[2])) if driver else None
    if driver_cuda not in PTX_ISA_OF_CUDA:
        known = ", ".join(f"{major}.{minor}" for major, minor in PTX_ISA_OF_CUDA)
        parser.error(f"--driver-cuda {args.driver_cuda!r}: expected a CUDA release whose PTX ISA is known: {known}")
    try:
        allows = read_allow_list(args.allow_file) if args.allow_file else {}
    except (OSError, ValueError) as error:
        parser.error(f"--allow-file: {error}")
    for allow in args.allow:
        glob, _, why = allow.partition("=")
        if not glob or not why.strip():
            parser.error(f"--allow {allow!r}: expected GLOB=WHY, with the reason")
        allows[glob] = why.strip()
    missing = [str(p) for p in args.paths if not p.exists()]
    if missing:
        parser.error(f"no such file or folder: {', '.join(missing)}")
    return check(args.paths or site_packages(), (int(match[1]), int(match[2])), allows, driver_cuda)


if __name__ == "__main__":
    sys.exit(main())
