"""What the lab needs about the services' side, below every other part of it: the cores a process may
use and how to share them (`cores`), where a runtime runs a model (`devices`), what a server's container
has and the one reader of nvidia-smi (`hardware`), a Ray Serve config for it (`serve_config`, run by the
Ray Serve container's start, whose image installs this package alone), and how the lab starts a FastAPI
service (`start`: uvicorn, as its Dockerfile does). It imports nothing else of servelab; the services
themselves (fastapi_pt/, fastapi_onnx/, ray_serve/, gourmetgram/, models_staging/) import none of it.
"""
