# Stand-in for quay.io/jupyter/minimal-notebook:2025-06-23 (quay.io), built by
# scripts/docker_bases.sh where that registry cannot be reached. It reproduces what the lab's
# Dockerfile.jupyter relies on: a Python environment in $CONDA_DIR (on the PATH, owned by the
# notebook user), the notebook user $NB_USER (uid 1000, group users, 100), `fix-permissions`,
# JupyterLab started by `start-notebook.py` on port 8888, apt as root, and a C library new enough
# for the perf_analyzer of tritonclient 2.53 (glibc 2.38 and libstdc++ of GCC 13; Ubuntu 24.04
# has 2.39). What differs: Debian 12 with the C and C++ runtime libraries of Debian 13, and
# Python 3.11 in a virtualenv where the real image has conda's Python 3.12.
ARG ROOTFS
FROM ${ROOTFS}
RUN mirror="$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)" \
 && echo "deb $mirror trixie main" > /etc/apt/sources.list.d/trixie.list \
 && printf 'Package: *\nPin: release n=trixie\nPin-Priority: 100\n' > /etc/apt/preferences.d/trixie \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -t trixie libc6 libstdc++6 > /dev/null \
 && rm -rf /var/lib/apt/lists/*
ENV CONDA_DIR=/opt/conda NB_USER=jovyan NB_UID=1000 NB_GID=100 LANG=C.UTF-8 SHELL=/bin/bash
ENV PATH=${CONDA_DIR}/bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/home/${NB_USER}
RUN useradd --create-home --uid "${NB_UID}" --gid "${NB_GID}" --shell /bin/bash "${NB_USER}" \
 && python3 -m venv "${CONDA_DIR}" \
 && "${CONDA_DIR}/bin/pip" install --no-cache-dir -q jupyterlab \
 && printf '#!/bin/sh\n# As the real image'"'"'s: group users may write, so any notebook user can; only what is\n# not so yet is changed (a file of an earlier layer is not copied into a new one).\nfor d in "$@"; do find "$d" ! \\( -group %s -a -perm -g+rwX \\) -exec chgrp %s {} + -exec chmod g+rwX {} +; done\n' "${NB_GID}" "${NB_GID}" > /usr/local/bin/fix-permissions \
 && printf '#!/bin/sh\nexec jupyter lab --ip=0.0.0.0 --port=8888 --no-browser "$@"\n' > /usr/local/bin/start-notebook.py \
 && chmod +x /usr/local/bin/fix-permissions /usr/local/bin/start-notebook.py \
 && chown -R "${NB_UID}:${NB_GID}" "${CONDA_DIR}" "/home/${NB_USER}"
EXPOSE 8888
WORKDIR /home/${NB_USER}
USER ${NB_UID}
CMD ["start-notebook.py"]
