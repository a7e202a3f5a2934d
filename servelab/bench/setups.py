"""What the benchmark measures, shared by its run (servelab.bench.run) and its report
(servelab.bench.report): the served setups, the naive reference apps, the in-process ceilings,
and how a load point's CPU time splits between the server, its event loop and the load generator.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class ServedSetup:
    """One way the lab serves the model, as the benchmark measures it."""

    name: str
    kind: str  # the load generator's target kind (loadgen.make_target)
    model: str | None  # Triton model
    runtime: str  # the in-process ceiling it is compared with: its runtime...
    decode: bool = True  # ...and whether the server decodes images (or gets tensors)


SETUPS = (
    ServedSetup("fastapi_pt", "fastapi", None, "pytorch"),
    ServedSetup("fastapi_onnx", "fastapi", None, "onnxruntime"),
    ServedSetup("triton/food_classifier", "triton-http", "food_classifier", "pytorch"),
    # Its clients send tensors they preprocessed themselves (here: once), so it is compared with
    # inference alone.
    ServedSetup("triton/food_classifier_onnx", "triton-http", "food_classifier_onnx", "onnxruntime", decode=False),
)
# The naive reference apps, measured at the highest concurrency only.
NAIVE = {"pytorch": "naive/pytorch", "onnxruntime": "naive/onnxruntime"}
# (runtime, decode) of every ceiling: each is swept for one request in flight and for many.
CEILINGS = (("pytorch", True), ("onnxruntime", True), ("onnxruntime", False))


def ceiling_key(runtime: str, decode: bool, in_flight: str) -> str:
    """A ceiling's name in the results and the report, e.g. "pytorch, decode, many"."""
    return f"{runtime}, {'decode' if decode else 'inference only'}, {in_flight}"


@dataclass
class CpuSplit:
    """CPU seconds spent while a load point's windows ran (warm-ups included): by the server's
    processes (its workers too), by their main threads (uvicorn's event loops: HTTP, JSON,
    FastAPI's routing and validation), and by this process (the load generator, and the resource
    sampler)."""

    server_s: float = 0.0
    event_loop_s: float = 0.0
    load_generator_s: float = 0.0
    wall_s: float = 0.0

    def __add__(self, other: CpuSplit) -> CpuSplit:
        return CpuSplit(*(mine + theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))

    def __sub__(self, other: CpuSplit) -> CpuSplit:
        return CpuSplit(*(mine - theirs for mine, theirs in zip(astuple(self), astuple(other), strict=True)))

    def overhead_share(self) -> float:
        """The event loop's and the load generator's part of all the CPU the requests cost. With
        every core busy, a service whose decoding and inference cost what the ceiling's do reaches
        at most 1 - this share of the ceiling, which pays for neither."""
        return (self.event_loop_s + self.load_generator_s) / (self.server_s + self.load_generator_s)

    def cores_busy(self, cores: int) -> float:
        """How busy the server and the load generator kept the cores, 0 to 1."""
        return (self.server_s + self.load_generator_s) / (self.wall_s * cores)
