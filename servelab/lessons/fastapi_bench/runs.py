"""The plans notebook 4's runs are served with, which its checks read (`CorePlans`): how it shares
the cores of the machine it runs on, by threads (the four thread plans it serves: inference slots x
threads per inference, each run named for its plan) and by processes (the plan the services follow,
servelab.service.cores.service_plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.lessons.expectations import machine_cores
from servelab.service.cores import ServicePlan, service_plan

SlotsAndThreads = tuple[int | None, int | None]  # (inference slots, threads per inference); None keeps the default


@dataclass(frozen=True)
class CorePlans:
    """The ways notebook 4 shares `cores` cores (those its process may use, unless given) with a
    model on `device` ("cpu", "cuda:0": what the service's /health says).

    - `threads`: the thread plans it serves, by name. The crowded plan has at least two slots, each
      with every core: more busy threads than cores, even on one core. Empty off the CPU, where the
      plans only change how the CPU shares its other work: their runs would spend the lease's
      minutes on verdicts NOT CHECKED.
    - `service`: the services' own plan of processes for these cores and this device."""

    device: str
    cores: int = field(default_factory=machine_cores)

    default = "default (elastic)"  # the plan that keeps the service's defaults

    @property
    def every_core(self) -> str:
        return f"1 slot x {self.cores} threads"

    @property
    def one_core(self) -> str:
        return f"{self.cores} slots x 1 thread"

    @property
    def crowded_slots(self) -> int:
        return max(2, self.cores)

    @property
    def crowded(self) -> str:
        return f"{self.crowded_slots} slots x {self.cores} threads"

    @property
    def threads(self) -> dict[str, SlotsAndThreads]:
        if self.device != "cpu":
            return {}
        return {
            self.every_core: (1, self.cores),
            self.one_core: (self.cores, 1),
            self.crowded: (self.crowded_slots, self.cores),
            self.default: (None, None),
        }

    @property
    def service(self) -> ServicePlan:
        return service_plan(self.cores, on_gpu=self.device.startswith("cuda"))

    def describe(self) -> str:
        """Which thread plans the notebook serves on these cores, or why none."""
        if self.threads:
            return (
                f"The model runs on the CPU, and this process may use {self.cores} core(s): {len(self.threads)} "
                "thread plans, each served alone and under load."
            )
        return (
            f"The model runs on {self.device}: PyTorch's threads per inference only share the CPU's other work "
            "(HTTP, JSON, decoding) there, too little to judge, so the thread plans are not run (their checks would "
            "read NOT CHECKED). Run this notebook on a CPU-only machine to see them."
        )
