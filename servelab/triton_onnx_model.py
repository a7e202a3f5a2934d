"""Triton Python-backend model that runs `model.onnx` with ONNX Runtime on the CPU.

Used only by the local stack, in place of Triton's onnxruntime backend, which the pip-installed
Triton does not ship. Same inputs and outputs as the onnxruntime-backend model (`input`
[N,3,224,224] -> `output` [N,11]), same graph file; the requests Triton gathers are run as one
ONNX Runtime call.
"""

import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        model_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "model.onnx")
        self.session = ort.InferenceSession(model_file, providers=["CPUExecutionProvider"])
        pb_utils.Logger.log_info(
            f"food_classifier_onnx instance {args['model_instance_name']}: onnxruntime {ort.__version__} on CPU"
        )

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(request, "input").as_numpy() for request in requests]
        outputs = self.session.run(["output"], {"input": np.concatenate(inputs)})[0]
        responses, start = [], 0
        for batch in inputs:
            chunk = outputs[start : start + len(batch)]
            start += len(batch)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("output", chunk)]))
        return responses
