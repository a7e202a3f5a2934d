"""Triton Python-backend model: base64 image in, Food-11 label and softmax probability out.

Triton hands `execute` every request its scheduler has gathered (one, or several when dynamic
batching is on, each with up to max_batch_size images). All their images go through MobileNetV2
(PyTorch, `food11.pth` beside this file) in one forward pass. An image that cannot be decoded
fails only its own request; a request its client cancelled (a gRPC cancel) before the forward pass
is answered CANCELLED instead of being computed, and the model logs how many.

The model times its own stages, decoding and the forward pass, in Triton's /metrics
(`lab_model_stage_us`): Triton's "compute infer" holds both, and decoding 16 images one after
another can outweigh their one forward pass.
"""

import json
import os
import time

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from torchvision.models import mobilenet_v2

from food11 import IMAGE_SIZE, LABELS, InvalidImageError, decode_base64_image, preprocess, top_prediction


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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        instance = args["model_instance_name"]

        # Threads. Each instance is a process with its own team of PyTorch threads, so the
        # instances share the cores: each gets the cores divided by the config's instances (a
        # KIND_GPU group runs its count on every GPU it lists), at least one, and all of them at
        # work keep every core busy and no more. INFERENCE_THREADS in the server's environment
        # sets the threads per instance instead.
        cores = usable_cores()
        instances = sum(group["count"] * max(1, len(group.get("gpus", []))) for group in config["instance_group"])
        setting = os.environ.get("INFERENCE_THREADS", "").strip()
        if setting and not (setting.isdigit() and int(setting) >= 1):
            raise pb_utils.TritonModelException(
                f"INFERENCE_THREADS={setting!r}: set it to a whole number of threads per instance, or unset it."
            )
        threads = int(setting) if setting else max(1, cores // instances)
        torch.set_num_threads(threads)  # Triton calls initialize and execute on the same thread

        # The device Triton gave this instance (its instance group's kind and GPU), proved by one
        # inference of a blank image there: a PyTorch without code for the GPU (a CUDA 13 build on
        # the node's P100, sm_60) moves the model there and fails at its first inference. Where
        # the GPU fails, the CPU, with a warning that says why.
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

        # This model's own time in each stage, in Triton's /metrics. The process label keeps each
        # instance's series its own: a reloaded instance starts its process before the old one ends.
        self.stage_family = pb_utils.MetricFamily(
            name="lab_model_stage_us",
            description="time a lab model spent in each of its stages, microseconds",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        labels = {"model": self.name, "process": str(os.getpid())}
        self.decode_us = self.stage_family.Metric(labels={**labels, "stage": "decode"})
        self.forward_us = self.stage_family.Metric(labels={**labels, "stage": "forward"})

        plan = f"{threads} thread(s) each, {instances} instance(s) on {cores} core(s)"
        plan += " (set by INFERENCE_THREADS)" if setting else " (the cores divided by the instances)"
        log = pb_utils.Logger.log_info
        if threads * instances > cores:
            log, plan = pb_utils.Logger.log_warn, plan + ": MORE THREADS THAN CORES, so the instances slow each other"
        log(
            f"{self.name} instance {instance} on {self.device} ({where}), first inference {first_ms:.1f} ms, "
            f"max_batch_size {config['max_batch_size']}; threads: {plan}"
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

    def execute(self, requests):
        responses = [None] * len(requests)
        images = {}  # index of a request -> its images, preprocessed: [n, 3, 224, 224]
        started = time.perf_counter_ns()
        for index, request in enumerate(requests):
            encoded = pb_utils.get_input_tensor_by_name(request, "INPUT_IMAGE").as_numpy().reshape(-1)
            try:
                images[index] = np.stack([preprocess(decode_base64_image(item)) for item in encoded])
            except InvalidImageError as exc:
                responses[index] = pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc)))
        self.decode_us.increment((time.perf_counter_ns() - started) / 1000)

        # is_cancelled() is a round trip to the server: asked once per request, after decoding.
        cancelled = [index for index in images if requests[index].is_cancelled()]
        for index in cancelled:
            del images[index]
            error = pb_utils.TritonError("cancelled by the client before inference", pb_utils.TritonError.CANCELLED)
            responses[index] = pb_utils.InferenceResponse(error=error)
        if cancelled:
            pb_utils.Logger.log_info(
                f"{self.name}: {len(cancelled)} cancelled request(s) answered CANCELLED, not computed"
            )

        if images:
            started = time.perf_counter_ns()
            logits = self._forward(np.concatenate(list(images.values())))
            self.forward_us.increment((time.perf_counter_ns() - started) / 1000)
            start = 0
            for index, batch in images.items():
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
        del self.decode_us, self.forward_us, self.stage_family  # the metrics before their family, as the backend asks
