"""A bare GPU machine, simulated for a test: every process of a command run with
`bare_machine_environment(folder)` imports only what such a machine has
(tests/data/bare_gpu_machine_packages.txt), the wheels scripts/gpu_check_wheels.sh carries there,
the standard library and the working tree; each process records what it found and was refused
(`bare_machine_records`). The GPU check's tests and notebook 6's claims' use it."""

from __future__ import annotations

import os
import re
import textwrap
from importlib import metadata
from pathlib import Path

from servelab import paths

# Installed in every process of a check (through PYTHONPATH, which the check passes on to every process it
# starts): the finders of this Python no longer find a package a bare GPU machine lacks (an import of it fails,
# importlib.util.find_spec says None, as there). Each process writes its command line to a record, then each
# package it finds or is refused, as it goes (a service stopped by a signal has no `atexit`).
BARE_MACHINE = textwrap.dedent(
    """
    import importlib.abc, os, sys

    LACKING = frozenset(os.environ["BARE_MACHINE_LACKS"].split(","))
    RECORD = open(os.path.join(os.environ["BARE_MACHINE_RECORDS"], f"{os.getpid()}.txt"), "w", buffering=1)
    with open("/proc/self/cmdline", "rb") as command:
        RECORD.write(command.read().replace(b"\\0", b" ").decode().strip() + "\\n")


    class BareMachine(importlib.abc.MetaPathFinder):
        def __init__(self, finders):
            self.finders, self.recorded = finders, set(sys.stdlib_module_names)

        def find_spec(self, name, path=None, target=None):
            package = name.partition(".")[0]
            if package in LACKING:
                self.record("refused", package)
                return None
            for finder in self.finders:
                if (spec := finder.find_spec(name, path, target)) is not None:
                    self.record("found", package)
                    return spec
            return None

        def find_distributions(self, *args, **kwargs):  # importlib.metadata asks the finders too
            for finder in self.finders:
                yield from getattr(finder, "find_distributions", lambda *args, **kwargs: ())(*args, **kwargs)

        def record(self, what, package):
            if package not in self.recorded:
                self.recorded.add(package)
                RECORD.write(f"{what} {package}\\n")


    sys.meta_path[:] = [BareMachine(list(sys.meta_path))]
    """
)


def bare_machine_records(folder: Path) -> dict[str, dict[str, set[str]]]:
    """What each process of a check under BARE_MACHINE found and was refused, by its command line."""
    records = {}
    for path in folder.glob("*.txt"):
        command, *lines = path.read_text().splitlines()
        records[command] = {
            what: {line.split()[1] for line in lines if line.startswith(what)} for what in ("found", "refused")
        }
    return records


def _normalized(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def carried_wheels() -> set[str]:
    """The distributions scripts/gpu_check_wheels.sh downloads for a bare GPU machine."""
    script = (paths.REPO_ROOT / "scripts" / "gpu_check_wheels.sh").read_text()
    listed = re.search(r"^WHEELS=\(\n(.*?)\n\)", script, re.M | re.S).group(1)  # names: the lock pins them
    return {_normalized(name) for name in listed.split()}


def lacking_on_a_bare_gpu_machine() -> set[str]:
    """The top-level modules installed here whose every distribution a bare GPU machine lacks (and
    scripts/gpu_check_wheels.sh does not bring)."""
    listed = (Path(__file__).parent.parent / "data" / "bare_gpu_machine_packages.txt").read_text().splitlines()
    there = {_normalized(line) for line in listed if line and not line.startswith("#")} | carried_wheels()
    there.add("servelab")  # the working tree
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if not any(_normalized(distribution) in there for distribution in distributions)
    }


def bare_machine_environment(folder: Path, also_there: frozenset[str] = frozenset()) -> dict[str, str]:
    """The environment of a command whose every process imports only what a bare GPU machine has
    (and the top-level modules `also_there`), recording each process's imports in `folder`/imports."""
    site = folder / "bare-machine"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BARE_MACHINE)
    records = folder / "imports"
    records.mkdir()
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        "BARE_MACHINE_LACKS": ",".join(sorted(lacking_on_a_bare_gpu_machine() - also_there)),
        "BARE_MACHINE_RECORDS": str(records),
    }
