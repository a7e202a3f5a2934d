"""The lanes (the root conftest.py): a test that starts or uses real servers is marked integration
where it is written, and `make test-fast` (-m "not integration") leaves it out; one that is not
marked fails, saying to mark it, so that no server fixture slips into the fast lane. Each case runs
in a pytest of its own, on a tiny test file, with the lab's root conftest.py."""

from __future__ import annotations

import subprocess
import textwrap

import nbformat

from tests.helpers import own_session


def pytest_in(folder, source: str, *arguments: str) -> subprocess.CompletedProcess:
    """pytest on `source`, written to folder/test_toy.py, with the stack's files at folder/stack."""
    (folder / "test_toy.py").write_text(textwrap.dedent(source))
    return own_session.pytest_in(folder, *arguments, SERVELAB_STACK_DIR=str(folder / "stack"))


TOY_TESTS = """
    import subprocess, sys

    import pytest

    # Prints its port once it listens, then serves until killed.
    SERVER = "import socket; s = socket.create_server(('127.0.0.1', 0)); print(s.getsockname()[1]); input()"


    def test_ports(ports):
        assert ports


    @pytest.fixture(scope="module")
    def toy_server():
        process = subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        yield int(process.stdout.readline())
        process.kill()
        process.wait()


    def test_unmarked(toy_server):
        assert toy_server


    @pytest.mark.integration
    def test_marked(toy_server):
        assert toy_server
"""


def test_a_test_not_marked_integration_that_uses_the_session_s_servers_or_starts_one_fails(tmp_path):
    run = pytest_in(tmp_path, TOY_TESTS, "test_toy.py")
    assert run.returncode == 1 and "1 passed" in run.stdout and "2 errors" in run.stdout, run.stdout
    assert "test_ports is not marked integration, yet it uses the session's servers (session_stack)" in run.stdout
    assert not (tmp_path / "stack" / "logs").exists(), "the session's servers were started"
    assert "test_unmarked is not marked integration, yet its setup started a server: pid " in run.stdout
    assert "-c import socket;" in run.stdout and "on port(s) [" in run.stdout


def test_every_notebook_is_in_the_integration_lane(tmp_path):
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")]), tmp_path / "toy.ipynb")
    run = pytest_in(tmp_path, "", "--nbmake", "--collect-only", "-m", "integration and notebook", "toy.ipynb")
    assert run.returncode == 0 and "1 test collected" in run.stdout, run.stdout
