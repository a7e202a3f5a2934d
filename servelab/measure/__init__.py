"""Measuring what the load generator cannot see from outside.

- `resources`: CPU/GPU sampling of the machine while a run lasts, reading the GPUs through `gpus`;
- `processes`: the CPU of named processes over a block, and a Triton model's instance processes;
- `timeline`: a run's requests over time;
- `service_stats`: a FastAPI or Ray Serve service's own metrics, read around a run;
- `queueing`: the queueing models a lesson compares with;
- `inprocess`: the in-process ceiling (the model called directly, no server).

May import: triton (its statistics), service and the foundation modules.
"""
