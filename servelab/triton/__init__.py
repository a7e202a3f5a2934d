"""Triton Inference Server as the lab runs it.

- `server`: the real Triton 2.51 binary on this machine, and staging the model repository for it;
- `config`: reading, editing and writing `config.pbtxt`, keeping its text (comments and all), which
  `config_text` rewrites field by field;
- `adaptation`: a config adapted to the server that serves it (its GPUs, its backends);
- `models`: the registry of models in models_staging/ and how to build a request for each;
- `stats`: Triton's statistics around a run (queue, compute, batch sizes);
- `perf_analyzer`: the real perf_analyzer, its command shown with its results;
- `container`: the Triton container's start in the Compose project;
- `onnx_model`: the Python-backend model that runs a model.onnx with ONNX Runtime, staged as a
  model's model.py where the server has no onnxruntime backend (it runs in the server's Python and,
  like the models of models_staging/, imports nothing of servelab).

May import: service and the foundation modules.
"""
