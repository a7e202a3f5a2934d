"""The local stack's ports: every port it uses (`Ports`: the settings', or ones the OS says are
free now), and whether one is free to bind (`port_is_free`).
"""

from __future__ import annotations

import socket
from contextlib import closing
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.settings import Settings, settings

if TYPE_CHECKING:  # Triton's tooling reads model configs with tritonclient: imported where Triton is served
    from servelab.triton import server as triton_local

_DEFAULT = Settings()


@dataclass(frozen=True)
class Ports:
    """Every port the local stack uses; each can be moved with SERVELAB_PORT_<NAME> (servelab.settings)."""

    fastapi_pt: int = _DEFAULT.port_fastapi_pt
    fastapi_onnx: int = _DEFAULT.port_fastapi_onnx
    triton_http: int = _DEFAULT.port_triton_http
    triton_grpc: int = _DEFAULT.port_triton_grpc
    triton_metrics: int = _DEFAULT.port_triton_metrics
    gourmetgram: int = _DEFAULT.port_gourmetgram
    image_host: int = _DEFAULT.port_image_host
    ray_serve: int = _DEFAULT.port_ray_serve
    ray_dashboard: int = _DEFAULT.port_ray_dashboard
    ray_metrics: int = _DEFAULT.port_ray_metrics
    jupyter: int = _DEFAULT.port_jupyter

    @classmethod
    def configured(cls) -> Ports:
        """The ports the settings give (the defaults, moved by SERVELAB_PORT_<NAME>)."""
        return cls(**settings().ports())

    @classmethod
    def found_free(cls) -> Ports:
        """Ports the OS says are free now. Nothing reserves them: another process may take one
        before a server binds it (start_on_free_ports tries again then)."""
        sockets = [socket.socket() for _ in cls.__dataclass_fields__]
        try:
            for sock in sockets:
                sock.bind(("127.0.0.1", 0))
            return cls(*(sock.getsockname()[1] for sock in sockets))
        finally:
            for sock in sockets:
                sock.close()

    @property
    def triton(self) -> triton_local.TritonPorts:
        from servelab.triton import server as triton_local

        return triton_local.TritonPorts(self.triton_http, self.triton_grpc, self.triton_metrics)


def port_is_free(port: int) -> bool:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        # As the servers themselves do: connections of a stopped server lingering in TIME_WAIT
        # do not make a port taken; only a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
