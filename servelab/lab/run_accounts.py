"""The figures of a run that the load generator does not measure, counted over the run and set on
its record before the lab keeps it (servelab.lab.run_keeper.RunKeeper.keep): the run a notebook
shows is the run it saved, every field (`lab.verdicts()` checks it).

- `ServiceAccount`: a service's own account of the run, from its /metrics (`result.service_stats`,
  servelab.measure.service_stats): any service with the FastAPI contract, Ray Serve's included;
- `TritonAccount`: Triton's statistics of one model over the run (`result.triton_stats`,
  servelab.triton.stats), and `cancelled_by_model`: the requests the model answered CANCELLED
  instead of computing them, which Triton counts as successes, read from the model's log (NaN
  where the lab cannot read Triton's log), and `stage_mean_ms`: the model's own time per execution
  in each of its stages, from Triton's metrics (empty for a model that reports none);
- `ResourcesAccount`: the machine, sampled during the run (`result.resources`,
  servelab.measure.resources.ResourceSampler).

A server that crashed under the run cannot give its account of it: that field stays None and a
note on the run says why (its row already says NOT A CLEAN RUN), and the run is saved all the same.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import requests

from servelab.measure import service_stats
from servelab.measure.resources import ResourceSampler
from servelab.polling import settled
from servelab.results import RunResult
from servelab.triton import stats as triton_stats

Run = TypeVar("Run", bound=RunResult)


class Account:
    """Counters read as a run starts and once it has ended; their difference is one field of the run."""

    field: str  # the RunResult field it sets

    def prepare(self) -> None:
        """Read what a run's warm-up already changes (the connections it opens), before it."""

    def start(self) -> None:
        """Read the counters before the run (or start sampling)."""

    def stop(self) -> None:
        """Stop what runs during the run (a sampler), as soon as the run ends."""

    def read(self) -> Any:
        """The field's value: what the counters say happened since `start`."""
        raise NotImplementedError


class ServiceAccount(Account):
    field = "service_stats"

    def __init__(self, url: str) -> None:
        self.url = url

    def prepare(self) -> None:
        # A closed loop opens its connections in its warm-up and keeps them: counted from here.
        self.before_warmup: service_stats.Scrape | None = service_stats.scrape(self.url)

    def start(self) -> None:
        # Settled: the answers of a warm-up that just ended are counted before it, not in the run.
        self.before = settled(lambda: service_stats.scrape(self.url))

    def read(self) -> dict[str, Any]:
        after = settled(lambda: service_stats.scrape(self.url))  # a service counts just after answering
        opened_since = getattr(self, "before_warmup", None)
        return service_stats.diff(self.url, self.before, after, connections_since=opened_since).to_dict()


class TritonAccount(Account):
    field = "triton_stats"

    def __init__(self, address: str, model: str, log: Path | None, metrics_url: str | None = None) -> None:
        self.address, self.model, self.log, self.metrics_url = address, model, log, metrics_url

    def _stages(self) -> dict[tuple[str, str], float]:
        if self.metrics_url is None:
            return {}
        return triton_stats.stage_times_us(requests.get(self.metrics_url, timeout=10).text, self.model)

    def start(self) -> None:
        self.before = triton_stats.fetch_settled(self.address, self.model)  # as ServiceAccount's
        self.stages_before = self._stages()
        self.log_offset = self.log.stat().st_size if self.log is not None and self.log.is_file() else None

    def read(self) -> dict[str, Any]:
        delta = triton_stats.diff(self.before, triton_stats.fetch_settled(self.address, self.model))
        # Read after the statistics have settled: the model counts a stage as its execution ends.
        stages = triton_stats.stage_mean_ms(self.stages_before, self._stages(), delta.execution_count)
        cancelled = (
            math.nan
            if self.log is None or self.log_offset is None
            else triton_stats.cancelled_by_model(triton_stats.log_since(self.log, self.log_offset), self.model)
        )
        return {**delta.to_dict(), "cancelled_by_model": cancelled, "stage_mean_ms": stages}


class ResourcesAccount(Account):
    field = "resources"

    def __init__(self, sampler: ResourceSampler) -> None:
        self.sampler = sampler

    def start(self) -> None:
        self.sampler.start()

    def stop(self) -> None:
        self.sampler.stop()

    def read(self) -> dict[str, Any]:
        return self.sampler.series()


def counted(measure: Callable[..., Run], accounts: Sequence[Account], after_warmup: bool = False) -> Run:
    """The run `measure()` returns, with each account's figures set on it. With `after_warmup`,
    `measure(on_measuring=...)` calls `on_measuring()` where its warm-up ends and measurement
    starts (the load generator's runs do), and the accounts start there: a service's counters
    then cover the requests the run measured and no others, so that figures combining the two
    (throughput x a mean service time: slots busy, by Little's law) come from one window."""
    started: list[Account] = []
    with contextlib.ExitStack() as running:

        def start() -> None:
            for account in accounts:
                account.start()
                running.callback(account.stop)
                started.append(account)

        for account in accounts:
            account.prepare()
        if after_warmup:
            result = measure(on_measuring=start)
        else:
            start()
            result = measure()
    if len(started) < len(accounts):  # stopped (Ctrl-C) during its warm-up: nothing was measured
        result.notes.append("no server counts: the run was stopped before its measurement started")
        return result
    for account in accounts:
        try:
            setattr(result, account.field, account.read())
        except (service_stats.ServiceStatsError, triton_stats.TritonStatsError) as unreadable:
            note = f"no {account.field}: they could not be read after the run ({unreadable})"
            result.notes.append(note)
            print(f"NOTE: {note}")
    return result
