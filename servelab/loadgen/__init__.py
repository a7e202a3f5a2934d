"""The lab's load generator: closed loop (N users) and open loop (a request rate), in asyncio.

- `endpoint`: where a run's load goes (`Endpoint`: the kind of server, its address, the model,
  what each request sends), described once and made into the run's target;
- `targets`: what a run sends requests to (FastAPI, or a Triton model over HTTP or gRPC), with
  one request prepared up front and sent again and again;
- `load`: a closed loop's `Load` (senders, bounds, warm-up, back-off, patience), and a run of
  sequences' `SequenceLoad`, described once and passed to the runner that sends it;
- `runners`: the closed and the open loop, and the `RunResult` each run returns;
- `sequences`: a stateful model's load, concurrent sequences of frames (`run_sequences`);
- `streams`: streamed requests, one answer per step, and clients who leave midway (`run_streams`);
- `sync`: the same from synchronous code (`closed_loop`, `open_loop`, `sequence_loop`, `stream_loop`),
  as notebooks call them;
- `processes`: one closed-loop point in client processes of their own, their CPU and the
  connections' spread over the server's processes (the GPU check's load);
- `cli`: the command line.

tritonclient (and the model registry, which reads configs with it) is imported where a Triton
request is built or sent: an HTTP load runs on a machine without it (a bare GPU machine).

From the shell:

    python -m servelab loadgen --target triton-http --address 127.0.0.1:8200 \
        --model food_classifier_onnx --concurrency 8 --requests 500 --out results.json
"""

from servelab.loadgen.cli import main
from servelab.loadgen.endpoint import DEFAULT_TIMEOUT_S, Endpoint
from servelab.loadgen.load import Load, SequenceLoad
from servelab.loadgen.runners import arrival_offsets, run_closed, run_open
from servelab.loadgen.sequences import (
    SEQUENCE_ERRORS,
    TritonHttpSequenceTarget,
    make_sequence_target,
    run_sequences,
    sequence_error_kind,
)
from servelab.loadgen.streams import HttpStreamTarget, make_stream_target, run_streams
from servelab.loadgen.sync import closed_loop, describe_result, open_loop, sequence_loop, stream_loop
from servelab.loadgen.targets import FastAPITarget, RequestError, Target, TritonHttpTarget, make_target

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Endpoint",
    "SEQUENCE_ERRORS",
    "FastAPITarget",
    "HttpStreamTarget",
    "Load",
    "RequestError",
    "SequenceLoad",
    "Target",
    "TritonHttpSequenceTarget",
    "TritonHttpTarget",
    "arrival_offsets",
    "closed_loop",
    "main",
    "make_sequence_target",
    "make_stream_target",
    "make_target",
    "open_loop",
    "run_closed",
    "run_open",
    "run_sequences",
    "run_streams",
    "sequence_error_kind",
    "sequence_loop",
    "stream_loop",
    "describe_result",
]
