"""Progress bars where someone watches (servelab.progress): a widget in a notebook's kernel, a text
bar on a terminal, nothing in CI; a run bounded by time shows its seconds, with its end as ETA."""

from __future__ import annotations

import time

import nbformat
import pytest
from nbclient import NotebookClient

from servelab import paths, progress
from servelab.loadgen import runners, sync


def wait_for(condition, limit_s: float = 30.0) -> bool:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_where_nobody_watches_no_bar_is_drawn_and_the_runner_logs_a_line_instead():
    assert progress.watched() is None  # pytest's stderr is no terminal, and this is no kernel
    assert progress.bar("c=2", 10, "request").disable
    assert runners.Recorder("c=2", 10, progress=True).line_at_end


def test_a_timed_bar_reaches_its_planned_end_and_restarts_for_the_measured_part(monkeypatch, capsys):
    monkeypatch.setattr(progress, "watched", lambda: "terminal")
    with progress.timed("c=4, warm-up", 0.6) as clock:
        assert not clock.bar.disable
        assert wait_for(lambda: clock.bar.n == clock.bar.total == 0.6), clock.bar.n
        clock.restart("c=4", 30)
        assert clock.bar.total == 30 and clock.bar.n < 30
    shown = capsys.readouterr().err
    assert "c=4, warm-up" in shown and "/30 s [" in shown and "<" in shown  # seconds, and the time left


@pytest.mark.parametrize("watched", ["terminal", None])
def test_a_run_bounded_by_time_is_shown_over_its_seconds_where_watched(monkeypatch, watched):
    monkeypatch.setattr(sync, "watched", lambda: watched)
    measured = []
    with sync._clocked("c=8", 30.0, True, lambda: measured.append(1), warms_up=True, warmup_s=5.0) as (
        runner_progress,
        on_measuring,
    ):
        on_measuring()
    assert measured == [1]
    # Watched: this bar replaces the runner's count, which has no total to give an ETA.
    assert runner_progress is (watched is None)
    with sync._clocked("c=8", None, True) as (runner_progress, on_measuring):  # bounded by requests
        assert runner_progress and on_measuring is None


@pytest.mark.integration  # a Jupyter kernel: a process listening on 127.0.0.1
def test_in_a_notebook_s_kernel_the_load_generator_s_bar_is_a_widget():
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "from servelab import progress\n"
            "from servelab.loadgen.runners import Recorder\n"
            "print(progress.watched())\n"
            "recorder = Recorder('c=2', 3, progress=True)\n"
            "recorder.bar.update(3)\n"
            "recorder.finish()\n"
            "print(recorder.line_at_end)"
        )
    ]
    NotebookClient(notebook, timeout=120, resources={"metadata": {"path": str(paths.REPO_ROOT)}}).execute()
    outputs = notebook.cells[0].outputs
    printed = "".join(output.get("text", "") for output in outputs if output.output_type == "stream")
    assert printed.split() == ["notebook", "False"]
    assert any("application/vnd.jupyter.widget-view+json" in output.get("data", {}) for output in outputs)
