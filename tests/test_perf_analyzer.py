"""perf_analyzer runs against the real local Triton, read back as the lab's RunResult.

Runs here accept windows that differ by up to 50%: these tests check what is measured and how it
is read, on a 2-core machine that may be busy, not how steady the machine is.
"""

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from servelab import paths
from servelab.lab import Lab, run_keeper
from servelab.profiles import profile
from servelab.report.summaries import shown_command, summary_line
from servelab.results import RunResult, append_result, load_appended
from servelab.triton import perf_analyzer
from servelab.triton.models import ModelRepository
from tests.helpers.perf_runs import run_stable

SAMPLE_CSV = (  # a real perf_analyzer -f report
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait\n"
    "2,77.4522,585,1962,10238,266,12097,422,0,25254,29286,31307,38699,25573,585,24953\n"
)


def test_csv_rows_become_run_results_with_a_server_breakdown():
    (row,) = perf_analyzer.parse_csv(SAMPLE_CSV)
    result = perf_analyzer.to_run_result(row, "triton/m (http)", stdout="    Request count: 233\n")
    assert (result.mode, result.concurrency, result.requests) == ("closed", 2, 233)
    assert result.throughput_rps == pytest.approx(77.4522)
    assert (result.latency.p50_ms, result.latency.p99_ms, result.latency.mean_ms) == pytest.approx(
        (25.254, 38.699, 25.573)
    )
    assert result.server_breakdown["server_queue_us"] == 10238
    assert result.server_breakdown["server_compute_infer_us"] == 12097


def test_csv_rows_come_in_the_order_of_their_load_levels_not_of_their_throughput():
    header, row = SAMPLE_CSV.splitlines()
    busier = "1,80.0," + row.split(",", 2)[2]  # c=1 served more than c=2: perf_analyzer writes it last
    assert [r["Concurrency"] for r in perf_analyzer.parse_csv(f"{header}\n{row}\n{busier}\n")] == [1, 2]
    rates = f"Request Rate,{header.split(',', 1)[1]}\n20,{row.split(',', 1)[1]}\n10,{row.split(',', 1)[1]}\n"
    assert [r["Request Rate"] for r in perf_analyzer.parse_csv(rates)] == [10, 20]


@pytest.fixture
def commands(monkeypatch) -> list[list[str]]:
    """The perf_analyzer process replaced by one that writes SAMPLE_CSV where -f says: the commands
    it was given."""
    commands = []

    def fake_run(command, **kwargs):
        commands.append(command)
        (Path(kwargs["cwd"]) / command[command.index("-f") + 1]).write_text(SAMPLE_CSV)
        return subprocess.CompletedProcess(command, 0, stdout="    Request count: 120\n", stderr="")

    monkeypatch.setattr(perf_analyzer.subprocess, "run", fake_run)
    return commands


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_sequence_options_reach_the_command_line(commands):
    (result,) = perf_analyzer.run(
        "127.0.0.1:1", "m", concurrency=4, sequence_length=8, sequence_length_variation=0, sequence_id_range=(100, 200)
    ).results
    (command,) = commands
    assert _option(command, "--concurrency-range") == "4"
    assert (_option(command, "--sequence-length"), _option(command, "--sequence-length-variation")) == ("8", "0")
    assert _option(command, "--sequence-id-range") == "100:200"
    assert "--num-of-sequences" not in command and "--serial-sequences" not in command
    assert result.requests == 120 and result.concurrency == 2  # read back as any other run (the CSV says 2)

    perf_analyzer.run(
        "127.0.0.1:1",
        "m",
        concurrency=None,
        request_rate=30,
        num_of_sequences=6,
        serial_sequences=True,
        sequence_id_range=(5, None),
    )
    command = commands[-1]
    assert _option(command, "--num-of-sequences") == "6" and "--serial-sequences" in command
    assert _option(command, "--sequence-id-range") == "5"  # no end: IDs without bound
    assert "--sequence-length" not in command  # perf_analyzer's default


def test_each_result_keeps_the_command_that_measured_it_and_saved_runs_keep_it_too(commands, monkeypatch, tmp_path):
    data = tmp_path / "input.json"
    data.write_text("{}")
    monkeypatch.chdir(tmp_path)
    (result,) = perf_analyzer.run(
        "127.0.0.1:1", "m", concurrency=None, request_rate=30, input_data="input.json"
    ).results
    (command,) = commands
    assert result.command == command
    # The input by its absolute path, the report by its name: perf_analyzer runs in a folder of its own.
    assert _option(command, "--input-data") == str(data) and _option(command, "-f") == "report.csv"
    assert _option(command, "--request-rate-range") == "30" and "--stability-percentage" in command
    assert perf_analyzer.run("127.0.0.1:1", "m", input_data="random").command[-2:] == ["--input-data", "random"]
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))).command == command
    append_result(tmp_path / "runs.jsonl", result, {})
    ((saved, _),) = load_appended(tmp_path / "runs.jsonl")
    assert saved.command == command


def test_a_run_s_summary_shows_its_command_under_it_with_short_paths_quoted_for_a_shell():
    (row,) = perf_analyzer.parse_csv(SAMPLE_CSV)
    data = paths.REPO_ROOT / ".lab" / "perf input.json"
    command = [str(paths.REPO_ROOT / ".venv/bin/perf_analyzer"), "-u", "127.0.0.1:8000", "--input-data", str(data)]
    result = perf_analyzer.to_run_result(row, "triton/m (http)", command=command)
    first, second = summary_line(result).split("\n")
    assert first == summary_line(perf_analyzer.to_run_result(row, "triton/m (http)"))  # a run with no command: one line
    assert second == "  command: perf_analyzer -u 127.0.0.1:8000 --input-data '.lab/perf input.json'"
    elsewhere = ["/opt/perf_analyzer", "--input-data", "/data/x.json"]
    assert shown_command(elsewhere) == "perf_analyzer --input-data /data/x.json"


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ({"num_of_sequences": 6}, "only at a request rate"),
        ({"serial_sequences": True}, "only at a request rate"),
        ({"sequence_length": 0}, "at least 1"),
        ({"sequence_length_variation": 150}, "a percentage"),
        ({"sequence_id_range": (10, 10)}, "1 <= start < end"),
    ],
)
def test_impossible_sequence_options_are_refused_before_perf_analyzer_runs(commands, option, says):
    with pytest.raises(ValueError, match=says):
        perf_analyzer.run("127.0.0.1:1", "m", concurrency=4, **option)
    assert commands == []


@pytest.mark.integration
def test_closed_loop_run_against_the_local_triton(triton_http_url):
    run = run_stable(
        triton_http_url,
        "food_classifier_onnx",
        concurrency=2,
        shape=["input:3,224,224"],
        request_count=20,
        stability_percentage=50,
    )
    (row,), (result,) = run.rows, run.results
    assert row["Concurrency"] == 2 and "Request concurrency: 2" in run.stdout
    assert result.tool == "perf_analyzer" and result.name == "triton/food_classifier_onnx (http)"
    assert result.requests >= 20 and result.throughput_rps > 0
    assert 0 < result.latency.p50_ms <= result.latency.p99_ms
    breakdown = result.server_breakdown
    assert breakdown["server_compute_infer_us"] > 0
    # The server-side parts cannot add up to more than what the client waited for.
    server_side = sum(
        breakdown[k]
        for k in ("server_queue_us", "server_compute_input_us", "server_compute_infer_us", "server_compute_output_us")
    )
    assert server_side / 1000 <= result.latency.mean_ms
    assert RunResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


@pytest.mark.integration
def test_batched_requests_over_grpc_count_requests_and_images(triton_grpc_url):
    (result,) = run_stable(
        triton_grpc_url,
        "food_classifier_onnx",
        concurrency=1,
        batch_size=4,
        protocol="grpc",
        shape=["input:3,224,224"],
        request_count=10,
        stability_percentage=50,
    ).results
    assert result.batch_size == 4 and result.name.endswith("(grpc)")
    assert result.images_per_s == pytest.approx(4 * result.throughput_rps)


@pytest.mark.integration
def test_request_rate_mode_with_poisson_arrivals(triton_http_url):
    (result,) = run_stable(
        triton_http_url,
        "food_classifier_onnx",
        concurrency=None,
        request_rate=10,
        request_distribution="poisson",
        shape=["input:3,224,224"],
        measurement_interval_ms=2000,
        stability_percentage=60,
    ).results
    assert (result.mode, result.rate_rps, result.arrival) == ("open", 10, "poisson")
    assert result.throughput_rps == pytest.approx(10, rel=0.5)
    assert result.latency.mean_ms > 0


@pytest.mark.integration
def test_a_notebook_s_measurement_prints_the_command_that_ran_and_that_command_measures_again(
    triton_http_url, triton_grpc_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(run_keeper, "SAVED_RUNS_DIR", tmp_path / "results")
    lab = Lab("local", profile("quick"), {}, triton_http_url, triton_grpc_url, None, notebook="perf_command")
    # The ONNX model: its short requests settle perf_analyzer's windows even on a busy machine (the
    # Python-backend model's input file, shown by its path in the repository, is tested above).
    result = lab.triton.perf("food_classifier_onnx", attempts=3, concurrency=2)
    assert result is not None
    command = result.command
    assert Path(command[0]).name == "perf_analyzer" and _option(command, "-m") == "food_classifier_onnx"
    assert (_option(command, "--concurrency-range"), _option(command, "-b")) == ("2", "1")
    assert (_option(command, "--stability-percentage"), _option(command, "--max-trials")) == ("50", "5")
    # Printed under the run's summary, as a student reads it: the program by its name.
    assert f"{summary_line(result)}\n" in capsys.readouterr().out
    line = summary_line(result).split("\n")[1]
    shown = shlex.split(line.removeprefix("  command: "))
    assert shown == ["perf_analyzer", *command[1:]]
    ((saved, _),) = load_appended(tmp_path / "results" / "perf_command.jsonl")
    assert saved.command == command
    # It is the command that ran: run again by hand, it measures the same model at the same load.
    for _attempt in range(3):  # as lab.triton.perf does: perf_analyzer's windows may not settle on a busy machine
        again = subprocess.run(
            command, cwd=tmp_path, env=perf_analyzer.environment(), capture_output=True, text=True, timeout=300
        )
        if not any(message in again.stdout + again.stderr for message in perf_analyzer.UNSTABLE_MESSAGES):
            break
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    (row,) = perf_analyzer.parse_csv((tmp_path / "report.csv").read_text())
    assert row["Concurrency"] == 2 and row["Inferences/Second"] > 0
    assert "Request concurrency: 2" in again.stdout


@pytest.mark.integration
def test_a_model_the_server_does_not_have_is_a_clear_error(triton_http_url):
    with pytest.raises(perf_analyzer.PerfAnalyzerError, match="exited with"):
        perf_analyzer.run(triton_http_url, "no_such_model", concurrency=1, request_count=5, timeout_s=60)


@pytest.mark.integration
@pytest.mark.skipif(
    not (paths.MODELS_STAGING_DIR / "food_sequence").is_dir(),
    reason="models_staging/food_sequence (the stateful model of lesson 10) is not in this checkout",
)
def test_sequences_to_the_stateful_model(triton_http_url, tmp_path):
    """perf_analyzer finds the sequence batcher in the model's config and sends sequences of 4 frames."""
    image_input = ModelRepository().get("food_sequence").perf_analyzer_input(paths.SAMPLE_IMAGE.read_bytes(), tmp_path)
    run = run_stable(
        triton_http_url,
        "food_sequence",
        concurrency=2,
        sequence_length=4,
        sequence_length_variation=0,
        request_count=20,
        # What is checked is that sequences are sent, not a figure: windows of 20 requests in
        # 4-frame sequences may differ by more than half on a shared machine's busiest minutes.
        stability_percentage=100,
        **image_input,
    )
    (result,) = run.results
    assert "--sequence-length" in run.command and result.concurrency == 2
    assert result.requests >= 20 and result.throughput_rps > 0
