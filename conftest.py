"""Root pytest configuration, for the tests and for the notebooks run by nbmake (`make test`, or
`pytest --nbmake notebooks/*.ipynb` from the repository root): what they write and where, the
servers they share, and which lane each item is in.

Notebooks run by the suite use the quick profile: every experiment still runs, with short
measurement windows; set LAB_PROFILE=full to override. The runs they measure are saved to a
temporary folder, not to results/, which holds what a student measured; the session's servers keep
their logs and staged files in another (SERVELAB_STACK_DIR), not in .lab/, where a running `make up`
keeps its own. Both are set here, before anything imports servelab.paths.
"""

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

os.environ.setdefault("LAB_PROFILE", "quick")
os.environ.setdefault("LAB_SERVICES", "local")
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
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

# Fixtures that start real server processes: the session's, and those of single modules (the load
# generator's synthetic server, the image host and services of tests/test_image_url.py...).
SERVER_FIXTURES = {
    "session_stack", "ray_serve", "gourmetgram", "server", "image_host", "service", "redirector", "held_image",
}  # fmt: skip


def is_notebook(item: pytest.Item) -> bool:
    """nbmake's item for a notebook (nbmake.pytest_items.NotebookItem says so with `nbmake = True`)."""
    return getattr(item, "nbmake", False)


def notebook_time_limit_s(item: pytest.Item) -> int | None:
    """The whole-notebook limit in the notebook's metadata (written by scripts/build_notebooks.py)."""
    metadata = json.loads(item.path.read_text())["metadata"]
    return metadata.get("servelab", {}).get("notebook_timeout_s")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark what runs real servers or runtimes (`make test-fast` leaves it out): every notebook
    (marked `notebook` too, which tests/lab_servers.py reads) and every test that uses a server fixture; give a
    notebook its own time limit (pyproject.toml's 300 s is a test's); run the notebooks last: they
    take longest, and a broken unit is better found first."""
    for item in items:
        if is_notebook(item):
            item.add_marker(pytest.mark.notebook)
            if limit := notebook_time_limit_s(item):
                item.add_marker(pytest.mark.timeout(limit))
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("notebook"):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("notebook") is not None)


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
