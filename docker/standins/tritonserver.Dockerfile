# Stand-in for nvcr.io/nvidia/tritonserver:24.10-py3 (NVIDIA's registry), built by
# scripts/docker_bases.sh where that registry cannot be reached. It reproduces what the lab's
# Dockerfile.triton and the Triton container's start rely on: `tritonserver` on the PATH,
# /opt/tritonserver/backends/python, and `python3`/`pip3` installing system-wide, where the Python
# backend's stub finds the packages. The server is the same release, Triton 2.51.0, from PyPI's
# nvidia-pytriton wheel: the version it reports is the image's, and so is its cancellation race
# (notebook 10 and the appendix read the version). What differs, and what the lab does about it:
# - it has the Python backend only: the start of the Triton container serves an ONNX Runtime model
#   with the Python backend running the same graph, as the local stack does, and says so;
# - no /opt/tritonserver/lib and no CUDA: Dockerfile.triton's guard of the server's libraries runs
#   only for a GPU (CUDA_ARCH), which the CPU variant asks for none of;
# - Debian 12's Python 3.11, not Ubuntu's.
ARG ROOTFS
FROM ${ROOTFS}
RUN rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED
# Pinned: 0.7.0 is the nvidia-pytriton release that ships Triton 2.51.0.
RUN pip install --no-cache-dir --no-deps nvidia-pytriton==0.7.0 \
 && wheel="$(python3 -c 'import importlib.util as u; print(u.find_spec("pytriton").submodule_search_locations[0])')/tritonserver" \
 && version="$(python3 -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')" \
 && mkdir -p /opt/tritonserver/bin /opt/tritonserver/backends/python \
 && printf '#!/bin/sh\nexec %s/bin/tritonserver "$@"\n' "$wheel" > /opt/tritonserver/bin/tritonserver \
 && chmod +x /opt/tritonserver/bin/tritonserver \
 && for name in libtriton_python.so triton_python_backend_utils.py; do \
        ln -s "$wheel/backends/python/$name" "/opt/tritonserver/backends/python/$name"; done \
 && ln -s "$wheel/python_backend_stubs/$version/triton_python_backend_stub" /opt/tritonserver/backends/python/ \
 && ! ldd "$wheel/bin/tritonserver" "$wheel/python_backend_stubs/$version/triton_python_backend_stub" | grep "not found"
# The server and the stub find the libraries bundled in the wheel relative to their real location:
# the server is started through a script, the stub through a symbolic link.
ENV PATH=/opt/tritonserver/bin:/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["tritonserver"]
