"""What runs inside a service: the FastAPI prediction API and its ONNX Runtime app, image fetching,
client disconnects, metrics, thread plans, devices, and Food-11's labels and preprocessing.

Every service installs this package, locally (the lab's virtualenv, editable) and in every Docker
image (built from the repository root): the FastAPI apps, Ray Serve's replicas, GourmetGram and
Triton's Python-backend models. It imports nothing else of servelab.
"""
