#!/bin/bash
# Runs the command it is given (Triton) with its output going both to the container's log, as
# before (`docker logs triton_server`), and to $TRITON_LOG_FILE, a file in a volume the Jupyter
# container mounts: the models log there what the server's statistics do not count (notebook 10
# reads how many requests a model answered CANCELLED instead of computing them).
set -euo pipefail
if [[ -n "${TRITON_LOG_FILE:-}" ]]; then
  mkdir -p "$(dirname "$TRITON_LOG_FILE")"
  # exec keeps the command as the container's main process, so `docker stop` reaches it directly.
  # Appended: after a crash, the restarted server's log follows the lines that tell why it ended
  # (the container's start empties it for a new container).
  exec "$@" > >(tee -a "$TRITON_LOG_FILE") 2>&1
fi
exec "$@"
