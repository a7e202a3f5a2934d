"""Triton Python-backend model that runs `model.onnx` with ONNX Runtime on the CPU.

Used only by the local stack, in place of Triton's onnxruntime backend, which the pip-installed
Triton does not ship. It serves any ONNX model folder with the same inputs and outputs as its
config declares (the names must be the ONNX graph's, as the onnxruntime backend requires too);
the requests Triton gathers are run as one ONNX Runtime call, except those whose client has
cancelled them (a gRPC cancel), which are answered with CANCELLED instead, and logged.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

from servelab.triton.model_instance import cancelled_response, set_up_instance


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        # Each instance is a process with its own threads. The instances share the cores out
        # elastically (see cores.py): an inference gets the cores divided by the inferences running
        # in all instances, so one ONNX Runtime session per thread count it may be given.
        self.instance = set_up_instance(args, config, pb_utils.Logger)
        model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        self.sessions = {}
        for threads in self.instance.plan.thread_counts():
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            # Idle threads sleep instead of spinning, so they leave the core to the other instances.
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.sessions[threads] = ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
        # What the sessions run on, as ONNX Runtime reports it, not what they were asked for.
        in_use = sorted({provider for session in self.sessions.values() for provider in session.get_providers()})
        self.instance.log_started(f"on cpu (onnxruntime {ort.__version__} ({', '.join(in_use)}))")

    def execute(self, requests):
        cancelled = self.instance.cancelled(requests)  # logged
        kept = [request for request, gone in zip(requests, cancelled, strict=True) if not gone]
        answers = iter(self._run(kept) if kept else [])
        return [cancelled_response(pb_utils) if gone else next(answers) for gone in cancelled]

    def _run(self, requests):
        batches = [
            {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.input_names}
            for request in requests
        ]
        feed = {name: np.concatenate([batch[name] for batch in batches]) for name in self.input_names}
        with self.instance.threads_at_work() as threads:
            outputs = self.sessions[threads].run(self.output_names, feed)
        responses, start = [], 0
        for batch in batches:
            size = len(batch[self.input_names[0]])
            tensors = [
                pb_utils.Tensor(name, value[start : start + size])
                for name, value in zip(self.output_names, outputs, strict=True)
            ]
            start += size
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def finalize(self):
        self.instance.close()
