"""`python -m servelab loadgen ...`: one load-generator run from the shell."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from servelab import paths
from servelab.loadgen.endpoint import DEFAULT_TIMEOUT_S, TARGET_KINDS, Endpoint
from servelab.loadgen.load import Load, SequenceLoad
from servelab.loadgen.runners import ARRIVALS
from servelab.loadgen.sync import closed_loop, describe_result, open_loop, sequence_loop
from servelab.results import RunResult, save_results

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    """`python -m servelab loadgen ...`: one run, a summary on stdout, optionally saved as JSON."""
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m servelab loadgen",
        description="Load a FastAPI service or Triton with a closed loop (--concurrency) or an open loop (--rate), "
        "or a stateful Triton model with concurrent sequences of frames (--sequences).",
    )
    parser.add_argument("--target", required=True, choices=TARGET_KINDS)
    parser.add_argument("--address", required=True, help="FastAPI: base URL (http://127.0.0.1:8101); Triton: host:port")
    parser.add_argument("--model", help="Triton model (a folder of models_staging/), e.g. food_classifier_onnx")
    parser.add_argument("--image", type=Path, default=paths.SAMPLE_IMAGE, help="the image every request sends")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument("--concurrency", type=int, help="closed loop: this many requests in flight")
    load.add_argument("--rate", type=float, help="open loop: requests per second, on a schedule")
    load.add_argument("--sequences", type=int, help="sequence mode (a stateful model): this many sequences at once")
    parser.add_argument("--arrival", choices=ARRIVALS, default="constant", help="open loop: gaps between arrivals")
    parser.add_argument("--sequence-length", type=int, default=10, help="sequence mode: frames per sequence")
    parser.add_argument("--frame-interval", type=float, help="sequence mode: seconds between a sequence's frames")
    parser.add_argument("--total-sequences", type=int, help="sequence mode: stop after this many sequences started")
    parser.add_argument("--requests", type=int, help="stop after this many measured requests")
    parser.add_argument("--duration", type=float, help="stop after this many seconds of measurement")
    parser.add_argument("--warmup-s", type=float, default=0.0, help="seconds of unmeasured requests first")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="per-request timeout, seconds")
    parser.add_argument("--out", type=Path, help="save the result here as JSON (servelab.results format)")
    args = parser.parse_args(argv)
    if args.sequences is not None:
        if args.target == "fastapi" or args.requests is not None or args.warmup_s:
            parser.error(
                "--sequences sends frames to a Triton model, without warm-up: bound it with --total-sequences "
                "or --duration"
            )
    elif args.requests is None and args.duration is None:
        parser.error("give --requests, --duration or both (the run stops at whichever comes first)")
    if args.target != "fastapi" and not args.model:
        parser.error("Triton targets need --model (a folder of models_staging/, e.g. food_classifier_onnx)")
    if args.concurrency is not None and args.arrival != "constant":
        parser.error("--arrival applies to an open loop (--rate), not to --concurrency")

    if threading.current_thread() is threading.main_thread():
        # A shell starts background jobs with SIGINT ignored, and Python keeps that: make Ctrl-C
        # (or `kill -INT`) stop the run cleanly in every case.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from servelab.triton.models import ModelError  # the registry's, imported with tritonclient where it is used

    result: RunResult
    try:
        endpoint = Endpoint(args.target, args.address, args.model, args.image.read_bytes(), args.timeout)
        if args.sequences is not None:
            sequence_load = SequenceLoad(
                args.sequences, args.sequence_length, args.total_sequences, args.duration, args.frame_interval
            )
            result = sequence_loop(endpoint, sequence_load)
        elif args.concurrency is not None:
            result = closed_loop(endpoint, Load(args.concurrency, args.requests, args.duration, warmup_s=args.warmup_s))
        else:
            result = open_loop(endpoint, args.rate, args.arrival, args.requests, args.duration, args.warmup_s)
    except (ValueError, ModelError) as exc:
        log.error("%s", exc)
        return 2
    print(describe_result(result))
    if args.out:
        save_results([result], args.out, metadata={"command": ["loadgen", *argv]})
        print(f"Saved to {args.out}")
    if any(note.startswith("stopped early by Ctrl-C") for note in result.notes):
        return 130  # the shell's code for "ended by SIGINT", though the partial result was kept
    return 0 if result.latencies_ms or not result.requests else 1
