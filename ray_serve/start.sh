#!/bin/sh
# The ray_serve container's command: a one-node Ray with serve_config.yaml deployed, as
# `serve run serve_config.yaml` would start it, except that Ray's dashboard (Serve's REST API,
# where notebook 9 deploys its edited configs) and Ray's metrics answer on the Compose network.
# Neither port is published on the host, and both want Ray's token, which this script writes to
# the volume the Jupyter container shares (read-only there), with the container's hardware: the
# config is deployed as written with a GPU, and with a share of the cores per replica without one
# (servelab.service.serve_config), and the notebooks adapt their edits the same way.
set -eu

token="${RAY_AUTH_TOKEN_PATH:?set RAY_AUTH_TOKEN_PATH (the Compose file does)}"
if [ ! -s "$token" ]; then
    mkdir -p "$(dirname "$token")"
    python -c "import secrets; print(secrets.token_hex(32))" > "$token"
fi
# Readable by the Jupyter container's user (group users, 100), no one else.
chgrp 100 "$token" && chmod 0640 "$token"

shared="${RAY_SHARED_DIR:?set RAY_SHARED_DIR (the Compose file does)}"
python -m servelab.service.serve_config serve_config.yaml /tmp/serve_config.served.yaml --hardware "$shared/hardware.json"

ray start --head --disable-usage-stats \
    --dashboard-host 0.0.0.0 --dashboard-port 8265 --metrics-export-port 8080
serve deploy /tmp/serve_config.served.yaml --address http://127.0.0.1:8265

# `docker compose down` sends SIGTERM: stop Ray cleanly. Until then, stay up while Ray runs.
trap 'ray stop; exit 0' TERM INT
while ray status > /dev/null 2>&1; do
    sleep 10 &
    wait $!
done
echo "Ray stopped; the container exits (Compose restarts it)." >&2
exit 1
