"""The local lab as processes on this machine (`make up`), and the model files it serves.

- `supervision`: services as supervised processes (started in order, restarted when they crash,
  and logged, stopped in reverse), on the ports of `ports` (the settings', or free ones);
- `catalogue`: the spec of every service of the lab: FastAPI, Triton, Ray Serve, GourmetGram, the
  image host, Jupyter;
- `artifacts`: builds the model files every service loads (`make artifacts`);
- `weights`: where their weights come from: a trained checkpoint (`original`: the original lab's),
  fetched and checked by its digest before it is read, or untrained.

May import: triton, service and the foundation modules.
"""
