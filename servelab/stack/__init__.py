"""The local lab as processes on this machine (`make up`), and the model files it serves.

- `local`: ports, supervised processes (restarted when they crash, and logged), and the specs of
  every service: FastAPI, Triton, Ray Serve, GourmetGram, the image host, Jupyter;
- `artifacts`: builds the model files every service loads (`make artifacts`);
- `weights`: where their weights come from: a trained checkpoint (`original`: the original lab's),
  fetched and checked by its digest before it is read, or untrained.

May import: triton, service and the foundation modules.
"""
