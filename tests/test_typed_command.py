"""A perf_analyzer command line as a student types it (servelab.triton.typed_command): refused with
what to change, or run against the lab's real Triton and read back as the lab's runs."""

from __future__ import annotations

import pytest

from servelab.lab import Lab, run_keeper, triton_side
from servelab.profiles import profile
from servelab.settings import Settings
from servelab.triton import perf_analyzer, typed_command
from servelab.triton.typed_command import TypedCommandError

MODELS = ["food_classifier", "food_classifier_onnx"]


def test_a_typed_line_is_read_for_what_the_lab_needs_and_passed_on_as_typed():
    typed = typed_command.parse("perf_analyzer -m food_classifier_onnx --concurrency-range 1:4:2 -i grpc", MODELS)
    read = (typed.model, typed.protocol, typed.batch_size, typed.request_rate)
    assert read == ("food_classifier_onnx", "grpc", 1, None)
    assert typed.arguments == ["-m", "food_classifier_onnx", "--concurrency-range", "1:4:2", "-i", "grpc"]
    rate = typed_command.parse(
        "perf_analyzer --model-name=food_classifier -b 4 --request-rate-range 30 --request-distribution poisson", MODELS
    )
    read = (rate.model, rate.protocol, rate.batch_size, rate.request_rate, rate.distribution)
    assert read == ("food_classifier", "http", 4, 30.0, "poisson")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("", "start the line with perf_analyzer"),
        ("perf_analyser -m food_classifier", "start the line with perf_analyzer"),
        ("perf_analyzer --concurrency-range 4", "name the model with -m: one of food_classifier, food_classifier_onnx"),
        ("perf_analyzer -m food_clasifier", "-m food_clasifier: the lab's Triton serves no such model"),
        ("perf_analyzer -m food_classifier -u example.com:8000", "leave -u out: the lab points"),
        ("perf_analyzer -m food_classifier --url=10.0.0.1:8001", "leave --url out"),
        ("perf_analyzer -m food_classifier -f /tmp/mine.csv", "leave -f out: the lab writes perf_analyzer's report"),
        ("perf_analyzer -m food_classifier -i grcp", "-i grcp: the protocol is http or grpc"),
        ("perf_analyzer -m food_classifier -b four", "give numbers"),
        ("perf_analyzer -m 'food_classifier", "the line does not parse"),
    ],
)
def test_a_line_the_lab_will_not_run_says_what_to_change(line, said):
    with pytest.raises(TypedCommandError, match=said.replace("(", r"\(")):
        typed_command.parse(line, MODELS)


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            "perf_analyzer -m food_classifier --concurrency-range 4 --measurement-request-count 20",
            "ignore --measurement-request-count 20 in this line: .*add --measurement-mode count_windows",
        ),
        (
            "perf_analyzer -m food_classifier --measurement-mode=time_windows --measurement-request-count=20",
            "ignore --measurement-request-count 20 .*add --measurement-mode count_windows",
        ),
        (
            "perf_analyzer -m food_classifier --measurement-mode count_windows -p 2000",
            "ignore -p 2000 .*--measurement-request-count requests are done: give that instead",
        ),
        (
            "perf_analyzer -m food_classifier --measurement-mode count_windows --measurement-interval=2000",
            "ignore --measurement-interval 2000 .*--measurement-request-count",
        ),
        (
            "perf_analyzer -m food_classifier --concurrency-range 4 --request-distribution poisson",
            "ignore --request-distribution poisson .*add --request-rate-range",
        ),
        (
            "perf_analyzer -m food_sequence --num-of-sequences 3",
            "ignore --num-of-sequences 3 .*add --request-rate-range",
        ),
        (
            "perf_analyzer -m food_classifier --request-period 5",
            "ignore --request-period 5 .*--periodic-concurrency-range",
        ),
        (
            "perf_analyzer -m food_classifier --concurrency-range 1:8:4 --max-threads 2",
            "ignore --max-threads 2 .*add -a",
        ),
        ("perf_analyzer -m food_classifier -i grpc -H Auth:x", "ignore -H Auth:x .*HTTP requests only"),
        ("perf_analyzer -m food_classifier -i grpc --input-tensor-format json", "ignore --input-tensor-format json"),
        ("perf_analyzer -m food_classifier --string-data x --string-length 4", "ignore --string-length 4"),
        ("perf_analyzer -m food_classifier --input-data data.json --string-data x", "ignore --string-data x"),
        (
            "perf_analyzer -m food_classifier --model-signature-name serve",
            "ignore --model-signature-name serve .*tfserving",
        ),
    ],
)
def test_a_line_with_an_option_perf_analyzer_would_ignore_says_what_to_type_instead(line, said):
    with pytest.raises(TypedCommandError, match=f"perf_analyzer would {said}"):
        typed_command.parse(line, [*MODELS, "food_sequence"], sequence_models=["food_sequence"])


@pytest.mark.parametrize(
    "line",
    [
        "perf_analyzer -m food_classifier --concurrency-range 4 --measurement-mode count_windows "
        "--measurement-request-count 20",
        "perf_analyzer -m food_classifier --measurement-interval 2000",
        "perf_analyzer -m food_classifier --measurement-mode time_windows -p 2000",
        "perf_analyzer -m food_classifier --request-rate-range 20 --request-distribution poisson",
        "perf_analyzer -m food_sequence --request-rate-range 20 --num-of-sequences 3",
        "perf_analyzer -m food_classifier --concurrency-range 1:8:4 -a --max-threads 2",
        "perf_analyzer -m food_classifier --concurrency-range 4 --max-threads 2",
        "perf_analyzer -m food_sequence --concurrency-range 1:8:4 --max-threads 2",
        "perf_analyzer -m food_classifier -H Auth:x",
        "perf_analyzer -m food_classifier --input-data random --string-length 4",
    ],
)
def test_the_same_options_where_they_take_effect_pass(line):
    typed = typed_command.parse(line, [*MODELS, "food_sequence"], sequence_models=["food_sequence"])
    assert typed.arguments == line.split()[1:]


def settled(lab: Lab, line: str) -> list:
    """The typed line's runs; tried up to three times, as the lab's own perf is, while perf_analyzer's
    windows do not agree on a busy machine (a student sees that message and runs it again)."""
    for _attempt in range(2):
        try:
            return lab.triton.run_typed(line)
        except perf_analyzer.NoStableMeasurement:
            continue
    return lab.triton.run_typed(line)


@pytest.mark.integration
def test_a_typed_line_runs_against_the_lab_s_triton_and_each_load_level_is_kept(
    triton_http_url, triton_grpc_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path / "results")
    lab = Lab("local", profile("quick"), {}, triton_http_url, triton_grpc_url, None, notebook="typed")
    line = (
        "perf_analyzer -m food_classifier_onnx -i grpc --concurrency-range 1:2:1 --measurement-mode count_windows "
        "--measurement-request-count 20 --stability-percentage 80"
    )
    runs = settled(lab, line)
    assert [run.concurrency for run in runs] == [1, 2] and all(run.throughput_rps > 0 for run in runs)
    assert runs[0].name == "triton/food_classifier_onnx (grpc), typed"
    command = runs[0].command
    assert command[1:3] == ["-u", triton_grpc_url] and command[-2:] == ["-f", "report.csv"]
    assert "--input-data" not in command, "the ONNX model takes tensors: perf_analyzer makes its own"
    assert "Request concurrency: 2" in capsys.readouterr().out, "perf_analyzer's own output, as it printed it"
    assert lab.results == runs
    # The Python-backend model takes the photo's bytes: the lab adds the sample as its input data.
    (photo,) = settled(
        lab, "perf_analyzer -m food_classifier --measurement-mode count_windows --measurement-request-count 10"
    )
    assert "--input-data" in photo.command and photo.throughput_rps > 0
    # A line that sets no stability gets the lab's own, and says so.
    assert photo.command[-4:-2] == ["--stability-percentage", f"{triton_side.STABILITY:g}"]
    assert "The lab added --stability-percentage 50" in capsys.readouterr().out
    # Where the answers must run (the tests' setting, conftest.py), a line that gives no run fails the cell.
    with pytest.raises(RuntimeError, match="LAB_ANSWERS_MUST_RUN is on.*Not run: -m food_clasifier"):
        lab.triton.perf_typed("perf_analyzer -m food_clasifier")
    # In a student's cell, a wrong line or perf_analyzer's own failure is printed, and gives no run.
    monkeypatch.setattr(triton_side, "settings", lambda: Settings.from_environ({}))
    capsys.readouterr()
    assert lab.triton.perf_typed("perf_analyzer -m food_clasifier") == []
    assert "Not run: -m food_clasifier: the lab's Triton serves no such model" in capsys.readouterr().out
    assert lab.triton.perf_typed("perf_analyzer -m food_classifier --no-such-option") == []
    assert "perf_analyzer gave no number; change the line" in capsys.readouterr().out
    assert len(lab.results) == 3, "none kept a run"
