"""Root pytest configuration, for the tests and for the notebooks run by nbmake (`make test`, or
`pytest --nbmake notebooks/*.ipynb` from the repository root): what they write and where, the
servers they share, and which lane each item is in.

A test that starts or uses real servers is marked `integration` where it is written: by its
module's `pytestmark = pytest.mark.integration`, or, in a module of unit tests too, by its own
`@pytest.mark.integration`; every notebook is marked here. `make test-fast` (-m "not integration")
leaves them out, and a test without the mark that reaches a server fails, saying to mark it: before
anything starts where the session's servers are asked for (tests/lab_servers.py), else as soon as
its setup has started a process that listens on a port.

Notebooks run by the suite use the quick profile: every experiment still runs, with short
measurement windows; set LAB_PROFILE=full to override. The runs they measure are saved to a
temporary folder, not to results/, which holds what a student measured; the session's servers keep
their logs and staged files in another (SERVELAB_STACK_DIR), not in .lab/, where a running `make up`
keeps its own. Both are set here, before anything imports servelab.paths.
"""

import atexit
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator

import psutil
import pytest

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_SERVICES", "local")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
# The notebooks' answers are the instructor's: one that gives no run fails its notebook.
os.environ.setdefault("LAB_ANSWERS_MUST_RUN", "on")
for variable, prefix in (
    ("SERVELAB_RESULTS_DIR", "servelab-test-results-"),
    ("SERVELAB_STACK_DIR", "servelab-test-stack-"),
):
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)

# The session's servers, for the tests' fixtures and the notebooks alike (a plugin, not tests/conftest.py,
# which pytest loads only where it collects something under tests/).
pytest_plugins = ["tests.lab_servers"]


def is_notebook(item: pytest.Item) -> bool:
    """nbmake's item for a notebook (nbmake.pytest_items.NotebookItem says so with `nbmake = True`)."""
    return getattr(item, "nbmake", False)


def notebook_time_limit_s(item: pytest.Item) -> int | None:
    """The whole-notebook limit in the notebook's metadata (written by scripts/build_notebooks.py)."""
    metadata = json.loads(item.path.read_text())["metadata"]
    return metadata.get("servelab", {}).get("notebook_timeout_s")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every notebook `notebook` (which tests/lab_servers.py reads) and `integration`: it runs
    against the lab's servers; give it its own time limit (pyproject.toml's 300 s is a test's); run
    the notebooks last: they take longest, and a broken unit is better found first."""
    for item in items:
        if is_notebook(item):
            item.add_marker(pytest.mark.notebook)
            item.add_marker(pytest.mark.integration)
            if limit := notebook_time_limit_s(item):
                item.add_marker(pytest.mark.timeout(limit))
    items.sort(key=run_order)


def run_order(item: pytest.Item) -> tuple[bool, int]:
    """Tests first, then the notebooks in the lab's order (10 after 9, where pytest's is 0, 10, 1);
    a notebook with no number (an appendix, or one a test writes) keeps its place after them."""
    if not is_notebook(item):
        return False, 0
    number = re.match(r"\d+", item.path.name)
    return True, int(number.group()) if number else sys.maxsize


# ---- no server in the fast lane ---------------------------------------------------------------


def unmarked_message(item: pytest.Item, reaches: str) -> str:
    return (
        f"{item.nodeid} is not marked integration, yet {reaches}. Mark it `@pytest.mark.integration`, or its "
        "module `pytestmark = pytest.mark.integration`, so that the fast lane (`make test-fast`) leaves it out."
    )


def listening(child: psutil.Process) -> str | None:
    """`child`, or the first of its descendants, that listens on a TCP port: what it runs and its
    ports; None where none does (or they have ended)."""
    try:
        for process in [child, *child.children(recursive=True)]:
            connections = process.net_connections(kind="tcp")
            if ports := sorted({c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN}):
                return f"pid {process.pid} ({' '.join(process.cmdline())[:100]}) on port(s) {ports}"
    except psutil.Error:
        pass
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    """A test not marked integration may start no server: one that asks for the session's servers
    fails before they start; one whose fixtures start a process (a child of this one) that listens
    on a port, itself or a process of its own, fails once they have (their teardown stops it as
    usual). Only new children count: a running server's own workers (Ray's) come and go."""
    # Imported by pytest already, as a plugin (which rewrites its asserts: importing it above would not).
    from tests.lab_servers import SESSION_SERVER_FIXTURES

    if item.get_closest_marker("integration"):
        return (yield)
    if used := SESSION_SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        pytest.fail(unmarked_message(item, f"it uses the session's servers ({', '.join(sorted(used))})"), pytrace=False)
    before = {child.pid for child in psutil.Process().children()}
    result = yield
    new = [child for child in psutil.Process().children() if child.pid not in before]
    if started := [found for found in map(listening, new) if found]:
        pytest.fail(unmarked_message(item, f"its setup started a server: {'; '.join(started)}"), pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    """A notebook stopped by its own time limit is said to be so, where nbmake, which knows only
    its cells' failures, would call it an internal error of its own."""
    report = yield
    if is_notebook(item) and call.excinfo is not None and call.excinfo.errisinstance(pytest.fail.Exception):
        report.longrepr = (
            f"{call.excinfo.value} The notebook ran past its whole-notebook limit (servelab.notebook_timeout_s "
            "in its metadata, written by scripts/build_notebooks.py), though no cell ran past its own."
        )
    return report


# ---- where the time went ----------------------------------------------------------------------

SLOWEST_SHOWN = 5
SESSION_STARTED = time.monotonic()  # when pytest loaded this file: collection is counted too
ITEM_SECONDS: Counter[str] = Counter()  # setup, call and teardown of each item, together


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    ITEM_SECONDS[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """The session's wall time and its slowest items, last in the log, where a slowdown shows
    first: a module's shared servers or fixtures count towards the item that started them."""
    minutes = (time.monotonic() - SESSION_STARTED) / 60
    terminalreporter.section(f"wall time {minutes:.1f} min; the {SLOWEST_SHOWN} slowest items")
    for nodeid, seconds in ITEM_SECONDS.most_common(SLOWEST_SHOWN):
        terminalreporter.write_line(f"{seconds:7.1f} s  {nodeid}")
