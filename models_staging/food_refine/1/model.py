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
them ended after the client had cancelled; servelab.triton.stats.refine_steps reads the lines.
(Python-backend metrics would count them, but incrementing one crashed Triton 2.51 here.)
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from food11 import DEFAULT_STEPS, InvalidImageError, RunningMean, Views, checked_steps, decode_base64_image
from servelab.service.cores import available_cores
from servelab.service.devices import onnx_session
from servelab.triton.model_instance import set_up_instance


def session_options(threads):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # Idle threads sleep instead of spinning, so they leave the core to the other instances.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException(
                f"{self.name} streams one response per step: its config.pbtxt needs "
                "model_transaction_policy { decoupled: true }."
            )
        setting = config["parameters"].get("abandon_on_cancel", {}).get("string_value", "on")
        if setting not in ("on", "off"):
            raise pb_utils.TritonModelException(f'{self.name}: abandon_on_cancel is "{setting}"; use "on" or "off".')
        self.abandon = setting == "on"
        # The first session says where the model runs (the GPU Triton gave the instance, proved by
        # one inference there, or the CPU with the runtime's reason), and the thread plan follows
        # from that, as in the services: on a CPU the instances share the cores out elastically
        # (cores.py), a step getting the cores divided by the instances at work.
        model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        first_threads = available_cores()
        self.instance = set_up_instance(
            args,
            config,
            pb_utils.Logger,
            lambda device: onnx_session(model_file, session_options(first_threads), device),
            gpu_by_index=False,
        )
        first, placement = self.instance.model, self.instance.placement

        def session_for(threads):
            """A session per thread count the plan may give a step; the others on the device the first got."""
            if threads == first_threads:
                return first
            return onnx_session(model_file, session_options(threads), placement.device)[0]

        self.sessions = {threads: session_for(threads) for threads in self.instance.plan.thread_counts()}
        self.instance.log_started(f"on {placement.describe()}, abandon_on_cancel {setting}")

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
            with self.instance.threads_at_work() as threads:
                logits = self.sessions[threads].run(["output"], {"input": views.batch(step)})[0]
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

    def finalize(self):
        self.instance.close()
