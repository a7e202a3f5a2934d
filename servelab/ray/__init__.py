"""Ray Serve on this machine, on loopback only.

- `local`: starts Ray and Serve with the shipped config, adapted to this machine (`make up`);
- `rest`: the Serve REST API (deploy, status, replicas) with the cluster's token;
- `cluster`: a two-node cluster on this machine, the lesson's spanning case;
- `watch`: samples a deployment's replicas and queues while a load runs.

May import: service and the foundation modules.
"""
