"""Triton Python-backend model, decoupled: photos refined over N steps, one response per step.

The refinement is the lab's (food11.py, as POST /refine serves it): step k runs
the ONNX MobileNetV2 (`model.onnx`, beside this file) on view k of every photo of the request, and
answers with the running mean's label and probability so far. The model is *decoupled*
(config.pbtxt): execute() answers each request through its response sender, one response per
step, then an empty response flagged final; clients read them over gRPC streaming.

Cancellation between responses: after each step, before sending it, the model asks
`response_sender.is_cancelled()` (a round trip to the server, once per step), which turns true
once the client has cancelled its stream (a gRPC cancel). From then on the steps are for nobody:
the model sends nothing more and stops there; the step running when the cancel arrived was
finished (a model call cannot be interrupted), and is counted as computed for nobody. With the
config parameter abandon_on_cancel "off" the model goes on to the last step anyway (notebook 10's
experiment).

The model logs each stream as it starts and as it ends, with the steps computed and how many of
them ended after the client had cancelled, the lines the lab counts. (Python-backend metrics would
count them, but incrementing one crashed Triton 2.51 here.)
"""

import json
import os
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from food11 import DEFAULT_STEPS, IMAGE_SIZE, InvalidImageError, RunningMean, Views, checked_steps, decode_base64_image

CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


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
    """A runtime's error in one line."""
    return " / ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        instance = args["model_instance_name"]
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"{self.name} streams one response per step: its config.pbtxt needs "
                "model_transaction_policy { decoupled: true }."
            )
        setting = config["parameters"].get("abandon_on_cancel", {}).get("string_value", "on")
        if setting not in ("on", "off"):
            raise pb_utils.TritonModelException(f'{self.name}: abandon_on_cancel is "{setting}"; use "on" or "off".')
        self.abandon = setting == "on"

        # Threads. Each instance is a process with its own ONNX Runtime threads, so the instances
        # share the cores: each gets the cores divided by the config's instances (a KIND_GPU group
        # runs its count on every GPU it lists), at least one; INFERENCE_THREADS in the server's
        # environment sets the threads per instance instead.
        cores = usable_cores()
        instances = sum(group["count"] * max(1, len(group.get("gpus", []))) for group in config["instance_group"])
        threads_setting = os.environ.get("INFERENCE_THREADS", "").strip()
        if threads_setting and not (threads_setting.isdigit() and int(threads_setting) >= 1):
            raise pb_utils.TritonModelException(
                f"INFERENCE_THREADS={threads_setting!r}: set it to a whole number of threads per instance, or unset it."
            )
        threads = int(threads_setting) if threads_setting else max(1, cores // instances)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle threads sleep instead of spinning, so they leave the core to the other instances.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")

        # The device Triton gave this instance, proved by one inference of a blank image there: a
        # CUDA library without code for the GPU (cuDNN 9.11 and later on the node's P100) loads
        # fine and fails at the first inference. Where the GPU fails, the CPU, with a warning
        # that says why.
        model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        asked = f"cuda:{args['model_instance_device_id']}" if args["model_instance_kind"] == "GPU" else "cpu"
        self.device, first_ms = asked, None
        if asked != "cpu":
            try:
                gpu = (CUDA, {"device_id": int(args["model_instance_device_id"])})
                self.session = ort.InferenceSession(model_file, options, providers=[gpu, CPU])
                self.session.disable_fallback()  # a run that fails on the GPU raises, never moves to the CPU unsaid
                if self.session.get_providers()[0] != CUDA:
                    providers = ", ".join(ort.get_available_providers())
                    raise RuntimeError(
                        f"no CUDA provider it could load (its build has {providers}; the log above says more)"
                    )
                first_ms = self._first_inference()
            except Exception as exc:
                pb_utils.Logger.log_warn(
                    f"{self.name} instance {instance}: asked ONNX Runtime for {asked}, runs on the CPU instead. "
                    f"Its reason: {reason(exc)}"
                )
                self.device = "cpu"
        if first_ms is None:
            self.session = ort.InferenceSession(model_file, options, providers=[CPU])
            first_ms = self._first_inference()
        where = f"onnxruntime {ort.__version__} ({self.session.get_providers()[0]})"
        if self.device != asked:
            where += f", INSTEAD OF THE GPU ASKED FOR ({asked})"

        plan = f"{threads} thread(s) each, {instances} instance(s) on {cores} core(s)"
        plan += " (set by INFERENCE_THREADS)" if threads_setting else " (the cores divided by the instances)"
        log = pb_utils.Logger.log_info
        if threads * instances > cores:
            log, plan = pb_utils.Logger.log_warn, plan + ": MORE THREADS THAN CORES, so the instances slow each other"
        log(
            f"{self.name} instance {instance} on {self.device} ({where}), first inference {first_ms:.1f} ms, "
            f"abandon_on_cancel {setting}; threads: {plan}"
        )

    def _first_inference(self):
        """One inference of a blank image; how long it took, in ms."""
        started = time.perf_counter()
        self.session.run(["output"], {"input": np.zeros((1, 3, IMAGE_SIZE, IMAGE_SIZE), np.float32)})
        return (time.perf_counter() - started) * 1000

    def execute(self, requests):
        for request in requests:  # one at a time: each is a stream of steps
            self._stream(request)
        return None  # a decoupled model answers through its response senders

    def _stream(self, request):
        sender = request.get_response_sender()
        try:
            steps = checked_steps(json.loads(request.parameters()).get("steps", DEFAULT_STEPS))
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy().reshape(-1)
            views = Views([decode_base64_image(item) for item in encoded])
        except (ValueError, InvalidImageError) as exc:
            error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        pb_utils.Logger.log_info(f"{self.name}: a stream of {steps} steps started")
        answer = RunningMean()
        computed = for_nobody = 0  # steps computed; of them, those whose client had cancelled by their end
        cancelled = sender.is_cancelled()  # while the request waited for the instance
        for step in range(1, steps + 1):
            if cancelled and self.abandon:
                break  # between two steps: the client has cancelled its stream
            logits = self.session.run(["output"], {"input": views.batch(step)})[0]
            computed += 1
            response = self._response(step, answer.add(logits))
            cancelled = sender.is_cancelled()
            if cancelled:
                for_nobody += 1  # computed, and nobody to send it to
            else:
                sender.send(response)
        pb_utils.Logger.log_info(
            f"{self.name}: {computed} of {steps} steps computed, {for_nobody} after the client cancelled"
        )
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    @staticmethod
    def _response(step, answers):
        labels = np.array([[label.encode()] for label, _ in answers], dtype=object)
        probabilities = np.array([[probability] for _, probability in answers], dtype=np.float32)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("STEP", np.full((len(answers), 1), step, dtype=np.int32)),
                pb_utils.Tensor("FOOD_LABEL", labels),
                pb_utils.Tensor("PROBABILITY", probabilities),
            ]
        )
