"""Triton Python-backend model: frames of a filmed meal in, the meal's running Food-11 label out.

Each request is one frame of one sequence. `execute` gets the frames Triton's sequence batcher
gathered (at most one per sequence), classifies all of them in one MobileNetV2 forward pass, and
adds each frame's softmax probabilities to its sequence's running mean.

The Python backend gives a model no state of its own between requests, so the state lives here,
keyed by the sequence (correlation) ID, in an LRU of `state_capacity` sequences. A sequence loses
its state when it ends, is evicted (the cache is full and a new sequence starts), expires (idle
longer than `idle_timeout_s`), times out (older than `sequence_timeout_s`) or is cancelled. A later
frame of a sequence that lost its state fails alone, NOT_FOUND, with a message that starts with
the reason (evicted, expired, timed out, cancelled, not started) and says what to do; a bounded
record of lost sequences keeps those reasons. Frames after END never get here: Triton itself
refuses a frame without START for a sequence it does not know (400, "must specify the START flag
on the first request of the sequence").

Cancel: a frame whose gRPC client cancelled it while this model holds it is answered CANCELLED
and its sequence's state dropped (`is_cancelled()` is asked once per request, after decoding: it
is a round trip to the server). A frame cancelled while it still waits in Triton's queue never
gets here: Triton fails it, and the state stays. A client that wants to stop a sequence sends
its last frame with the request parameter `cancel: true` and sequence_end: the frame is not
computed, the state is dropped, and the answer is a CANCELLED error, since there is no
classification to return.

Each execute logs one line per kind of event with its count ("food_sequence: evicted 3
sequence(s) ..."), which the lab counts from the log.
"""

import json
import os
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from torchvision.models import mobilenet_v2

from food11 import IMAGE_SIZE, LABELS, InvalidImageError, decode_base64_image, preprocess, softmax

# Lost sequences whose reason is remembered, beyond the state capacity: enough for every
# sequence a lesson runs, and a bound on memory however many sequences come and go.
LOST_RECORD_SIZE = 4096


@dataclass
class SequenceState:
    """The running mean of a sequence's frame probabilities, as a sum and a count.

    A plain mean, not an exponential average: a meal is one dish from its first frame to its
    last, so every frame is equal evidence, and forgetting early frames would only add noise.
    """

    started: float  # time.monotonic() of its first frame
    last_seen: float
    probability_sum: np.ndarray  # float64 [11]
    frames: int = 0


def positive_parameter(config, key):
    try:
        value = float(config["parameters"][key]["string_value"])
    except (KeyError, ValueError):
        value = 0.0
    if value <= 0:
        raise pb_utils.TritonModelException(
            f"{config['name']}: the config needs a positive number in parameters {{ key: {key!r} }}"
        )
    return value


def usable_cores():
    """The cores this process may use: its CPU affinity, capped by a container's CPU quota."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as cpu_max:  # "<quota> <period>", or "max <period>": no quota
            quota, period = cpu_max.read().split()
        return max(1, min(cores, int(quota) // int(period)))
    except (OSError, ValueError):
        return cores


def reason(exc):
    """A runtime's error in one line (PyTorch's CUDA errors span several)."""
    return " / ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def control(request, name):
    return bool(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


def error_response(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.capacity = int(positive_parameter(config, "state_capacity"))
        self.idle_timeout_s = positive_parameter(config, "idle_timeout_s")
        self.sequence_timeout_s = positive_parameter(config, "sequence_timeout_s")
        self.states = OrderedDict()  # sequence ID -> SequenceState, least recently used first
        self.lost = OrderedDict()  # sequence ID -> why it lost its state (the error message)
        instance = args["model_instance_name"]

        # Threads, as in food_classifier: each instance is a process with its own team of PyTorch
        # threads, and gets the cores divided by the config's instances (a KIND_GPU group runs its
        # count on every GPU it lists), at least one; INFERENCE_THREADS in the server's
        # environment sets the threads per instance instead.
        cores = usable_cores()
        instances = sum(group["count"] * max(1, len(group.get("gpus", []))) for group in config["instance_group"])
        setting = os.environ.get("INFERENCE_THREADS", "").strip()
        if setting and not (setting.isdigit() and int(setting) >= 1):
            raise pb_utils.TritonModelException(
                f"INFERENCE_THREADS={setting!r}: set it to a whole number of threads per instance, or unset it."
            )
        threads = int(setting) if setting else max(1, cores // instances)
        torch.set_num_threads(threads)  # Triton calls initialize and execute on the same thread

        # The device Triton gave this instance, proved by one inference of a blank image there (a
        # PyTorch without code for the GPU moves the model there and fails at its first inference);
        # where the GPU fails, the CPU, with a warning that says why.
        torch.backends.cudnn.allow_tf32 = False  # full FP32 on every GPU: answers as the CPU's
        asked = f"cuda:{args['model_instance_device_id']}" if args["model_instance_kind"] == "GPU" else "cpu"
        weights = os.path.join(os.path.dirname(os.path.abspath(__file__)), "food11.pth")
        self.device, first_ms = asked, None
        if asked != "cpu":
            try:
                first_ms = self._load(weights)
            except Exception as exc:  # no driver, no code for this GPU, its memory full...
                pb_utils.Logger.log_warn(
                    f"{self.name} instance {instance}: asked PyTorch for {asked}, runs on the CPU instead. "
                    f"Its reason: {reason(exc)}"
                )
                self.device = "cpu"
        if first_ms is None:
            first_ms = self._load(weights)
        where = f"torch {torch.__version__}"
        if self.device != "cpu":
            where = f"{torch.cuda.get_device_name(self.device)}, {where}"
        elif asked != "cpu":
            where += f", INSTEAD OF THE GPU ASKED FOR ({asked})"

        plan = f"{threads} thread(s) each, {instances} instance(s) on {cores} core(s)"
        plan += " (set by INFERENCE_THREADS)" if setting else " (the cores divided by the instances)"
        log = pb_utils.Logger.log_info
        if threads * instances > cores:
            log, plan = pb_utils.Logger.log_warn, plan + ": MORE THREADS THAN CORES, so the instances slow each other"
        log(
            f"{self.name} instance {instance} on {self.device} ({where}), first inference {first_ms:.1f} ms, "
            f"state capacity {self.capacity} sequences, idle timeout {self.idle_timeout_s:g} s, sequence timeout "
            f"{self.sequence_timeout_s:g} s; threads: {plan}"
        )

    def _load(self, weights):
        """Load MobileNetV2 with the Food-11 weights on self.device; the time of one blank inference there, in ms."""
        model = mobilenet_v2(num_classes=len(LABELS))
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))  # no pickled code runs
        self.model = model.to(self.device).eval()
        started = time.perf_counter()
        self._forward(np.zeros((1, 3, IMAGE_SIZE, IMAGE_SIZE), np.float32))
        return (time.perf_counter() - started) * 1000

    def _forward(self, batch):
        """Logits [N, 11] of a float32 batch [N, 3, 224, 224], back on the CPU."""
        with torch.inference_mode():
            return self.model(torch.from_numpy(batch).to(self.device)).float().cpu().numpy()

    # ---- state -------------------------------------------------------------------------------

    def _cancel(self, sequence_id, how, events):
        """Drop a cancelled sequence's state; the CANCELLED answer, which names how it was cancelled."""
        dropped = self.states.get(sequence_id)
        message = (
            f"cancelled: sequence {sequence_id} was cancelled {how}; its state "
            f"({dropped.frames if dropped else 0} frame(s)) was dropped; start a new sequence with sequence_start"
        )
        self._lose(sequence_id, message, events, "cancelled")
        return error_response(message, pb_utils.TritonError.CANCELLED)

    def _lose(self, sequence_id, message, events, kind):
        self.states.pop(sequence_id, None)
        self.lost[sequence_id] = message
        self.lost.move_to_end(sequence_id)
        while len(self.lost) > LOST_RECORD_SIZE:
            self.lost.popitem(last=False)
        events[kind] += 1

    def _expire_idle(self, now, events):
        # The LRU order is the order of last frames, so the idle sequences are all at the front.
        while self.states:
            sequence_id, state = next(iter(self.states.items()))
            if now - state.last_seen <= self.idle_timeout_s:
                break
            message = (
                f"expired: sequence {sequence_id} sent no frame for longer than the idle timeout "
                f"({self.idle_timeout_s:g} s, parameter idle_timeout_s), so its state was dropped; "
                "start it again with sequence_start"
            )
            self._lose(sequence_id, message, events, "expired")

    def _start(self, sequence_id, now, events):
        """A new state for the sequence (a START for a live ID restarts it, as Triton does)."""
        self.states.pop(sequence_id, None)
        self.lost.pop(sequence_id, None)
        self.states[sequence_id] = SequenceState(now, now, np.zeros(len(LABELS)))
        while len(self.states) > self.capacity:
            evicted = next(iter(self.states))
            message = (
                f"evicted: sequence {evicted} was evicted from the state cache (capacity {self.capacity} "
                "sequences, parameter state_capacity; the least recently used goes first) when a new "
                "sequence started; start it again with sequence_start"
            )
            self._lose(evicted, message, events, "evicted")
        return self.states[sequence_id]

    def _continue(self, sequence_id, now, events):
        """The sequence's state, or the message that says why it has none."""
        state = self.states.get(sequence_id)
        if state is None:
            events["refused"] += 1
            return self.lost.get(sequence_id) or (
                f"not started: this instance has no state for sequence {sequence_id} and no record of "
                "it; send its first frame with sequence_start"
            )
        if now - state.started > self.sequence_timeout_s:
            message = (
                f"timed out: sequence {sequence_id} ran longer than the sequence timeout "
                f"({self.sequence_timeout_s:g} s, parameter sequence_timeout_s), so its state was "
                "dropped; start a new sequence with sequence_start"
            )
            self._lose(sequence_id, message, events, "timed out")
            events["refused"] += 1
            return message
        state.last_seen = now
        self.states.move_to_end(sequence_id)
        return state

    # ---- inference ---------------------------------------------------------------------------

    def execute(self, requests):
        now = time.monotonic()
        events = Counter()
        self._expire_idle(now, events)
        responses = [None] * len(requests)
        frames = []  # (index of the request, sequence ID, its state, its preprocessed frame)
        ended = []
        for index, request in enumerate(requests):
            if not control(request, "READY"):
                # An empty slot of the `direct` strategy: it needs an answer, which Triton drops.
                responses[index] = pb_utils.InferenceResponse()
                continue
            sequence_id = request.correlation_id()
            if control(request, "END"):
                ended.append(sequence_id)
            if json.loads(request.parameters() or "{}").get("cancel") is True:
                responses[index] = self._cancel(sequence_id, "by its client (request parameter cancel)", events)
                continue
            if control(request, "START"):
                state = self._start(sequence_id, now, events)
            else:
                state = self._continue(sequence_id, now, events)
                if isinstance(state, str):
                    responses[index] = error_response(state, pb_utils.TritonError.NOT_FOUND)
                    continue
            encoded = pb_utils.get_input_tensor_by_name(request, "FRAME").as_numpy()[0, 0]
            try:
                frame = preprocess(decode_base64_image(encoded))
            except InvalidImageError as exc:
                responses[index] = error_response(str(exc), pb_utils.TritonError.INVALID_ARG)
                continue
            frames.append((index, sequence_id, state, frame))

        computed = []
        for index, sequence_id, state, frame in frames:
            if requests[index].is_cancelled():
                responses[index] = self._cancel(sequence_id, "by its client before inference (gRPC)", events)
            else:
                computed.append((index, state, frame))

        if computed:
            probabilities = softmax(self._forward(np.stack([frame for *_, frame in computed])).astype(np.float64))
            for (index, state, _), frame_probabilities in zip(computed, probabilities, strict=True):
                responses[index] = self._add_frame(state, frame_probabilities)
        # After END, Triton refuses the sequence's next frame itself, so the state can go now.
        for sequence_id in ended:
            self.states.pop(sequence_id, None)
        self._log(events)
        return responses

    def _add_frame(self, state, frame_probabilities):
        state.probability_sum += frame_probabilities
        state.frames += 1
        mean = state.probability_sum / state.frames
        best, frame_best = int(mean.argmax()), int(frame_probabilities.argmax())
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("SEQUENCE_LABEL", np.array([[LABELS[best].encode()]], dtype=object)),
                pb_utils.Tensor("SEQUENCE_PROBABILITY", np.array([[mean[best]]], dtype=np.float32)),
                pb_utils.Tensor("SEQUENCE_PROBABILITIES", mean[None].astype(np.float32)),
                pb_utils.Tensor("FRAME_LABEL", np.array([[LABELS[frame_best].encode()]], dtype=object)),
                pb_utils.Tensor("FRAMES_SEEN", np.array([[state.frames]], dtype=np.int32)),
            ]
        )

    def _log(self, events):
        details = {
            "evicted": f"state capacity {self.capacity}",
            "expired": f"idle over {self.idle_timeout_s:g} s",
            "timed out": f"older than {self.sequence_timeout_s:g} s",
            "cancelled": "by their clients",
        }
        for kind, detail in details.items():
            if events[kind]:
                pb_utils.Logger.log_info(f"{self.name}: {kind} {events[kind]} sequence(s) ({detail})")
        if events["refused"]:
            pb_utils.Logger.log_info(f"{self.name}: refused {events['refused']} request(s) of sequences without state")
