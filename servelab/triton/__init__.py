"""Triton Inference Server as the lab runs it.

- `server`: the real Triton 2.51 binary on this machine, and staging the model repository for it;
- `config`: reading, adapting and writing `config.pbtxt`;
- `models`: the registry of models in models_staging/ and how to build a request for each;
- `stats`: Triton's statistics around a run (queue, compute, batch sizes);
- `perf_analyzer`: the real perf_analyzer, its command shown with its results;
- `container`: the Triton container's start in the Compose project;
- `onnx_model`: the Python-backend model that runs a model.onnx with ONNX Runtime.

May import: service and the foundation modules.
"""
