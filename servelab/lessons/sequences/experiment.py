"""How notebook 11 talks to the stateful model (`StatefulModel`): frames by hand, runs of live
sequences, the model's log, a config tried for a while; through the notebook's Lab (`SequenceLab`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from servelab import paths
from servelab.results import SequenceRunResult
from servelab.triton import stats as triton_stats

if TYPE_CHECKING:
    from servelab.triton.config import TritonConfig

from servelab.lessons.sequences.views import describe


class SequenceLab(Protocol):
    """What `StatefulModel` uses of the notebook's Lab (servelab.lab.facade.Lab, which this layer
    does not import): its models, its Triton side, its profile and its measurer's sequence runs."""

    models: Any  # servelab.triton.models.ModelRegistry
    triton: Any  # servelab.lab.triton_side.TritonSide
    triton_grpc: str | None
    profile: Any  # servelab.profiles.Profile
    measurer: Any  # servelab.lab.measuring.Measurer: its `sequences`


# The outputs of the lab's stateful model (food_sequence) that a frame's answer shows.
FRAME_OUTPUTS = ("SEQUENCE_LABEL", "SEQUENCE_PROBABILITY", "FRAME_LABEL", "FRAMES_SEEN")


class StatefulModel:
    """A stateful Triton model (food_sequence) as notebook 11 talks to it: frames sent by hand over
    gRPC, each with its sequence ID and START/END flags; runs of live sequences from the lab's load
    generator; the model's log of evictions; a config tried for a while, then restored."""

    def __init__(self, lab: SequenceLab, model: str, client: Any = None) -> None:
        import tritonclient.grpc as grpcclient

        self.lab, self.model = lab, model
        self.client = client if client is not None else grpcclient.InferenceServerClient(lab.triton_grpc)

    @staticmethod
    def photos(count: int) -> list[Path]:
        """The first `count` of the lab's sample photos (GourmetGram's), to send as frames."""
        return sorted(paths.SAMPLE_IMAGE.parent.glob("*.jpg"))[:count]

    def frame(self, sequence_id: int, photo: bytes, start: bool = False, end: bool = False, **parameters: Any):
        """Send one frame of sequence `sequence_id` (START with `start`, END with `end`, request
        `parameters` such as cancel=True); the answer's outputs (FRAME_OUTPUTS, by name), or the
        error Triton or the model refused it with."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        request = self.lab.models.get(self.model).request(photo)
        inputs = [grpcclient.InferInput(t.name, list(t.array.shape), t.datatype) for t in request.inputs]
        for tensor, declared in zip(inputs, request.inputs, strict=True):
            tensor.set_data_from_numpy(declared.array)
        try:
            answer = self.client.infer(
                self.model,
                inputs,
                sequence_id=sequence_id,
                sequence_start=start,
                sequence_end=end,
                parameters=parameters or None,
            )
        except InferenceServerException as error:
            return error
        return {name: answer.as_numpy(name).reshape(-1)[0] for name in FRAME_OUTPUTS}

    @staticmethod
    def show(what: str, answer: object) -> None:
        """Print `answer` (a frame's, see `frame`) after `what`."""
        print(f"{what}: {describe(answer)}")

    def run(self, name: str, concurrency: int, length: int) -> SequenceRunResult:
        """`concurrency` live sequences of `length` frames for the profile's duration (after one
        unmeasured sequence), recorded as `name`, with Triton's account of the executions, printed."""
        result = self.lab.measurer.sequences(
            self.model,
            concurrency,
            length,
            name=name,
            duration_s=self.lab.profile.duration_s,
            warmup_sequences=1,
            triton_stats=True,
        )
        stats = result.triton_stats
        assert stats is not None, "measured with triton_stats=True"
        # The executions' compute time, shared among their frames.
        print(
            f"  {stats['inference_count']} frames in {stats['execution_count']} executions: average batch "
            f"{stats['avg_batch_size']:.2f}, {stats['compute_ms_per_inference']:.1f} ms of compute per frame"
        )
        return result

    def evictions_logged(self) -> float:
        """Evictions the model has logged so far (NaN where this notebook finds no log to read)."""
        log = self.lab.triton.log()
        if log is None:
            return math.nan
        return float(triton_stats.sequence_events(log.read_text(), self.model).get("evicted", 0))

    @contextlib.contextmanager
    def configured(self, config: TritonConfig) -> Iterator[None]:
        """The model served with `config` for the `with` block, its own config restored after."""
        self.lab.triton.configs.apply_config(self.model, config)
        try:
            yield
        finally:
            self.lab.triton.configs.restore_config(self.model)
