# Stand-in for python:3.11-slim-bookworm (Docker Hub), built by scripts/docker_bases.sh where that
# registry cannot be reached, and tagged with that name. What the lab's Dockerfiles rely on is the
# same: Debian 12 (bookworm), Python 3.11 as `python` and `python3`, with pip, and pip free to
# install system-wide (as in the official image). What differs:
# Debian's own CPython (/usr/bin, packages in /usr/local/lib/python3.11/dist-packages) instead of
# one built under /usr/local, so nothing in the lab may name a site-packages path.
ARG ROOTFS
FROM ${ROOTFS}
# Debian marks its Python as managed by apt (PEP 668); the official image's Python is not.
RUN rm -f /usr/lib/python3.*/EXTERNALLY-MANAGED
ENV LANG=C.UTF-8 PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin
CMD ["python3"]
