"""Triton Python-backend model: base64 image in, Food-11 label and softmax probability out.

Triton hands `execute` every request its scheduler has gathered (one, or several when dynamic
batching is on, each with up to max_batch_size images). All their images go through MobileNetV2
in one forward pass. An image that cannot be decoded fails only its own request.

Its own time in each stage, decoding and the forward pass, goes to Triton's /metrics
(`lab_model_stage_us`, servelab.triton.model_instance.StageClock): Triton's "compute infer"
holds both, and decoding 16 images one after another can outweigh their one forward pass.

A request whose client cancelled it (a gRPC cancel) before its forward pass is answered with
CANCELLED instead of being computed: `request.is_cancelled()` is asked once per request, after
decoding (each call is a round trip to the server, so not in a loop), and the model logs how many.
"""

import json
import os

import numpy as np
import torch
import triton_python_backend_utils as pb_utils

from food11 import InvalidImageError, decode_base64_image, preprocess, top_prediction

# Labels and preprocessing, where PyTorch runs, and the set-up every instance of the lab's
# Python-backend models does: the lab's package (servelab), installed in the server's Python.
from servelab.service.devices import torch_model
from servelab.triton.model_instance import StageClock, cancelled_response, set_up_instance


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        # The GPU Triton gave this instance, proved by one inference there; where PyTorch cannot
        # use it or that inference fails, the CPU, logged with PyTorch's reason, and the threads
        # are planned for the CPU. Every instance is a process with its own team of PyTorch
        # threads: on a CPU the instances share the cores out elastically (an inference gets the
        # cores divided by the instances at work; INFERENCE_THREADS in the server's environment
        # fixes the count instead).
        weights_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "food11.pth")
        self.instance = set_up_instance(args, config, pb_utils.Logger, lambda device: torch_model(weights_file, device))
        self.model = self.instance.model
        self.stages = StageClock(pb_utils, config["name"], ("decode", "forward"))
        # Triton calls initialize and execute on the same thread, so one team serves this instance
        # (the first inference's thread has ended).
        torch.set_num_threads(self.instance.plan.threads)
        self.instance.log_started(f"on {self.instance.placement.describe()}, max_batch_size {config['max_batch_size']}")

    def _images_of(self, request):
        """The request's images as a [n, 3, 224, 224] array (n = the client's own batch size)."""
        encoded = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy()
        return np.stack([preprocess(decode_base64_image(item)) for item in encoded.reshape(-1)])

    def execute(self, requests):
        with self.instance.threads_at_work() as threads:  # decoding counts as work too
            torch.set_num_threads(threads)
            return self._answer(requests)

    def _answer(self, requests):
        responses = [None] * len(requests)
        decoded = []  # (index of the request, its images)
        with self.stages.timed("decode"):
            for index, request in enumerate(requests):
                try:
                    decoded.append((index, self._images_of(request)))
                except InvalidImageError as exc:
                    responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        gone = self.instance.cancelled([requests[index] for index, _ in decoded])  # logged
        cancelled = [index for (index, _), is_gone in zip(decoded, gone, strict=True) if is_gone]
        for index in cancelled:
            responses[index] = cancelled_response(pb_utils)
        decoded = [(index, images) for index, images in decoded if index not in cancelled]

        if decoded:
            with self.stages.timed("forward"):
                logits = self.model(np.concatenate([images for _, images in decoded]))
            start = 0
            for index, batch in decoded:
                predictions = top_prediction(logits[start : start + len(batch)])
                start += len(batch)
                labels = np.array([[label.encode()] for label, _ in predictions], dtype=object)
                probabilities = np.array([[probability] for _, probability in predictions], dtype=np.float32)
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("FOOD_LABEL", labels),
                        pb_utils.Tensor("PROBABILITY", probabilities),
                    ]
                )
        return responses

    def finalize(self):
        self.stages.close()
        self.instance.close()
