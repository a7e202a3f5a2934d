"""The plans notebook 4's runs are served with, which its checks read (`CorePlans`): how it shares
the cores of the machine it runs on, by threads (the three thread plans it serves: inference slots x
threads per inference, each run named for its plan) and by processes (the plan the services follow,
servelab.service.cores.service_plan); and so what the notebook asks on that machine (the thread
plans on a CPU, the GPU's use on a GPU).
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

    @property
    def every_core(self) -> str:
        return f"1 slot x {self.cores} threads"

    @property
    def one_core(self) -> str:
        return f"{self.cores} slots x 1 thread (the default)"

    @property
    def default(self) -> str:
        """The services' own plan (app.py): a slot per core, one thread each."""
        return self.one_core

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
        }

    @property
    def service(self) -> ServicePlan:
        return service_plan(self.cores, on_gpu=self.device.startswith("cuda"))

    def describe(self) -> str:
        """Which thread plans the notebook serves on these cores, or why none, and so which of its
        questions this machine answers."""
        if self.threads:
            return (
                f"The model runs on the CPU, and this process may use {self.cores} core(s): {len(self.threads)} "
                "thread plans, each served alone and under load. Predict them where a cell says 'On a CPU'; leave "
                "the cells that say 'On a GPU'."
            )
        return (
            f"The model runs on {self.device}: PyTorch's threads per inference only share the CPU's other work "
            "(HTTP, JSON, decoding) there, too little to judge, so the thread plans are not run (their checks would "
            "read NOT CHECKED). Run this notebook on a CPU-only machine to see them. Here, predict where a cell "
            "says 'On a GPU' (how busy the GPU stays under load); leave the cells that say 'On a CPU'."
        )

    def questions(self) -> str:
        """The notebook's closing questions and what to hand in, for what ran on this machine: on a
        CPU the thread plans' question and plot, on a GPU the GPU's use under load instead."""
        second = (
            "Which thread plan served worst under load, and why do more busy threads than cores hurt?"
            if self.threads
            else "How busy was the GPU while sixteen senders waited for the slots (the resources plot, or nvtop)? "
            "What would let one model call give it more work?"
        )
        plots = "the latency plot and the slots x threads plot" if self.threads else "the latency and resources plots"
        return "\n".join(
            [
                "1. With 16 senders, where did a request's time go (slot wait, decoding, inference)? Would a faster "
                "model or more slots shorten it more, on this machine?",
                f"2. {second}",
                "3. How close was your prediction for `processes_to_try`, and what limited the gain?",
                "",
                f"Hand in: the results table, {plots}, with your predictions beside the verdicts.",
            ]
        )
