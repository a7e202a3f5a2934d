"""Triton Python-backend model that runs `model.onnx` with ONNX Runtime on the CPU.

The lab's stand-in for Triton's onnxruntime backend where the server has none (the pip-installed
Triton of the local stack; servelab.triton.server stages it as the model's model.py). It serves any
ONNX model folder with the inputs and outputs its config declares (the names must be the ONNX
graph's, as the onnxruntime backend requires too). The requests Triton gathers run as one ONNX
Runtime call, except those whose client has cancelled them (a gRPC cancel): those are answered
CANCELLED instead, and logged. Like the lab's other models, it imports nothing of the lab's package.
"""

import json
import os
import time

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def usable_cores():
    """The cores this process may use: its CPU affinity, capped by a container's CPU quota."""
    cores = len(os.sched_getaffinity(0))
    try:
        with open("/sys/fs/cgroup/cpu.max") as cpu_max:  # "<quota> <period>", or "max <period>": no quota
            quota, period = cpu_max.read().split()
        return max(1, min(cores, int(quota) // int(period)))
    except (OSError, ValueError):
        return cores


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]

        # Threads. Each instance is a process with its own ONNX Runtime threads, so the instances
        # share the cores: each gets the cores divided by the config's instances, at least one;
        # INFERENCE_THREADS in the server's environment sets the threads per instance instead.
        cores = usable_cores()
        instances = sum(group["count"] * max(1, len(group.get("gpus", []))) for group in config["instance_group"])
        setting = os.environ.get("INFERENCE_THREADS", "").strip()
        if setting and not (setting.isdigit() and int(setting) >= 1):
            raise pb_utils.TritonModelException(
                f"INFERENCE_THREADS={setting!r}: set it to a whole number of threads per instance, or unset it."
            )
        threads = int(setting) if setting else max(1, cores // instances)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle threads sleep instead of spinning, so they leave the core to the other instances.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")

        # On the CPU whatever the instance's kind: this stand-in serves where the server has no GPU.
        model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        self.session = ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])
        started = time.perf_counter()  # one inference of zeros proves the model runs here
        first = self.session.get_inputs()[0]
        blank = np.zeros([dim if isinstance(dim, int) else 1 for dim in first.shape], np.float32)
        self.session.run(None, {first.name: blank})
        first_ms = (time.perf_counter() - started) * 1000

        plan = f"{threads} thread(s) each, {instances} instance(s) on {cores} core(s)"
        plan += " (set by INFERENCE_THREADS)" if setting else " (the cores divided by the instances)"
        log = pb_utils.Logger.log_info
        if threads * instances > cores:
            log, plan = pb_utils.Logger.log_warn, plan + ": MORE THREADS THAN CORES, so the instances slow each other"
        provider = self.session.get_providers()[0]  # what the session runs on, not what it was asked for
        log(
            f"{self.name} instance {args['model_instance_name']} on cpu (onnxruntime {ort.__version__} ({provider})), "
            f"first inference {first_ms:.1f} ms; threads: {plan}"
        )

    def execute(self, requests):
        responses = [None] * len(requests)
        inputs = {}  # index of a request -> its input arrays, by name
        for index, request in enumerate(requests):
            if request.is_cancelled():  # a round trip to the server: asked once per request
                error = pb_utils.TritonError("cancelled by the client before inference", pb_utils.TritonError.CANCELLED)
                responses[index] = pb_utils.InferenceResponse(error=error)
            else:
                inputs[index] = {
                    name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.input_names
                }
        if len(inputs) < len(requests):
            cancelled = len(requests) - len(inputs)
            pb_utils.Logger.log_info(f"{self.name}: {cancelled} cancelled request(s) answered CANCELLED, not computed")

        if inputs:
            feed = {name: np.concatenate([arrays[name] for arrays in inputs.values()]) for name in self.input_names}
            outputs = self.session.run(self.output_names, feed)
            start = 0
            for index, arrays in inputs.items():
                size = len(arrays[self.input_names[0]])
                tensors = [
                    pb_utils.Tensor(name, output[start : start + size])
                    for name, output in zip(self.output_names, outputs, strict=True)
                ]
                responses[index] = pb_utils.InferenceResponse(output_tensors=tensors)
                start += size
        return responses
