"""What the lab needs about the services' side, below every other part of it: the cores a process may
use and how to share them (`cores`), where a runtime runs a model (`devices`), what a server's container
has (`hardware`), a Ray Serve config for it (`serve_config`, run by the Ray Serve container's start), how
the lab starts a FastAPI service (`start`: uvicorn, as its Dockerfile does), and the CUDA build guard
(`cuda_arch`).

The services themselves (fastapi_pt/, fastapi_onnx/, ray_serve/, gourmetgram/) import none of it. Triton's
Python-backend models still import `cores` and `devices`, and the Ray Serve and Triton images install this
package for their starts. It imports nothing else of servelab.
"""
