"""Notebook 8's checks: where the download runs, inside the predict slot or outside it; and a burst
of requests on N slots (Truss's case: 10 requests, 5 slots, the 6th waits).

D and S are the service's own mean download and inference times (its /metrics around a run, in
`RunResult.service_stats`); throughputs are the client's.
"""

from __future__ import annotations

from servelab.lessons.expectations import (
    Estimate,
    Expectation,
    Figure,
    condition,
    figure,
    measured,
    unless,
    unless_each,
)
from servelab.results import RunResult


def stage(run: RunResult | None, name: str, label: str):
    """The service's mean time of one stage in `run`, as a figure."""
    return figure(run, f"service_stats.stage_mean_ms.{name}", label)


def slot_holds_only_inference(
    inside: dict[int, RunResult], outside: dict[int, RunResult], enough: int, latency_ms: float, hardware: str
) -> Expectation:
    """With a download of `latency_ms`, one slot, runs by number of senders for each design (inside
    the slot, `inside`; outside it, `outside`). Inside, more senders only lengthen the queue (the
    slot is the limit, within 15%); outside, the most senders go above the inside design's limit,
    1 / (D + S), and `enough` senders keep the slot busy (throughput x (P + S), by Little's law on
    the slot, which decodes its photo P, then infers S). The two comparisons of the designs are NOT
    CHECKED where the download took under a tenth of an inference (D < S / 10): inside or outside
    the slot, it then cannot move the limit."""
    few, top = sorted(c for c in inside if c > 1)[0], max(inside)
    rate_few, rate_top = (
        figure(inside[few], "throughput_rps", f"inside, {few}"),
        figure(inside[top], "throughput_rps", f"inside, {top}"),
    )
    d_in, s_in = stage(inside[top], "download", "D inside"), stage(inside[top], "inference", "S inside")
    rate_out = figure(outside[top], "throughput_rps", f"outside, {top}")
    wait_in, wait_out = (
        stage(inside[top], "slot_wait", "slot wait inside"),
        stage(outside[top], "slot_wait", "slot wait outside"),
    )
    saturated = outside[enough]
    rate_many, p_many, s_many = (
        figure(saturated, "throughput_rps", f"outside, {enough}"),
        stage(saturated, "preprocess", f"P outside, {enough}"),
        stage(saturated, "inference", f"S outside, {enough}"),
    )
    in_slot = p_many.value + s_many.value  # what a request holds the slot for, the download outside it
    d_many = stage(saturated, "download", "D").value
    bound_in = 1000 / (d_in.value + s_in.value)
    busy = rate_many.value * in_slot / 1000
    change = rate_top.value / rate_few.value - 1
    arriving = 1000 * enough / (d_many + in_slot)  # what those senders could send, never waiting
    short = (
        f"the download took {d_in.value:.1f} ms, under a tenth of an inference ({s_in.value:.1f} ms): inside or "
        "outside the slot, it cannot move the limit"
    )
    return Expectation(
        f"with a {latency_ms:g} ms download, the slot should hold the model's work, never the download",
        (
            condition(
                f"inside the slot, more senders only lengthen the queue: from {few} to {top} senders the "
                "throughput changes by less than 15%",
                abs(change) < 0.15,
                rate_few,
                rate_top,
                detail=f"{change:+.0%}",
            ),
            unless(
                not d_in.value < s_in.value / 10,
                short,
                condition(
                    f"outside the slot, {top} senders go above 1 / (D + S)",
                    rate_out.value > bound_in,
                    rate_out,
                    d_in,
                    s_in,
                    detail=f"1 / (D + S) = {bound_in:.1f} req/s",
                ),
            ),
            condition(
                f"outside the slot, {enough} senders keep the slot busy at least 70% of the time",
                busy >= 0.7,
                rate_many,
                p_many,
                s_many,
                detail=f"busy {busy:.0%} = throughput x (P + S)",
            ),
            unless(
                not d_in.value < s_in.value / 10,
                short,
                condition(
                    f"with {top} senders, a request waits longer for the slot when the download is inside it",
                    wait_in.value > wait_out.value,
                    wait_in,
                    wait_out,
                ),
            ),
        ),
        reason=f"{enough} senders, each needing D + P + S = {d_many + in_slot:.0f} ms when nothing waits, "
        f"send at most {arriving:.0f} req/s, and the slot's limit is {1000 / in_slot:.0f} req/s"
        + (
            ": more senders are needed to keep the slot busy"
            if arriving < 1000 / in_slot
            else f"; on {hardware}, the downloads, the decoding and the load generator share the cores with the "
            "inference (a hypothesis: this run does not measure their share)"
        ),
        estimate=Estimate.ratio(
            f"the requests per second of {top} senders with the download outside the slot, over inside it",
            rate_out.value,
            rate_top.value,
        ),
    )


def queued_waits(sent: int, slots: int) -> float:
    """Inferences the `sent` requests of a burst wait for, on average, when `slots` run at once:
    the i-th to be ready waits for floor(i / slots) of them (10 on 5 slots: 5 wait one, 0.5)."""
    return sum(i // slots for i in range(sent)) / sent


def burst_waits_only_for_slots(burst: RunResult, sent: int, slots: Figure | float) -> Expectation:
    """`sent` requests by URL sent at once to a service with `slots` predict slots (its /health's
    figure, or the number it said), judged on the service's own counts and means (D, decoding P,
    slot wait W, S). Requests that each wait for floor(i / slots) inferences wait E = S x
    `queued_waits` on average. Wrong outcomes: more than `slots` inferring at once (W under E / 2:
    nobody waited), or only `slots` downloading and preprocessing at once (W at least (S + D / 2) x
    `queued_waits`, toward the (D + P + S) x `queued_waits` of downloads held behind the slots).
    With no more requests than slots nobody has to wait: both NOT CHECKED.

    Counts and means cannot show the peak number inferring, and W also holds the event loop's delay
    in handing decoded requests to the slots: on a busy machine that alone can come near S / 2
    (measured on 2 shared cores: W 37 ms, S 87 ms, 10 requests on 10 slots), so W >= E / 2 catches
    more than `slots` inferring only where that delay is small; the slots' pool of `slots` threads
    bounds them.
    """
    counts = [
        stage_count(burst, name, label)
        for name, label in (("download", "downloaded"), ("preprocess", "preprocessed"), ("inference", "inferred"))
    ]
    d, wait, s = stage(burst, "download", "D"), stage(burst, "slot_wait", "W"), stage(burst, "inference", "S")
    slots = slots if isinstance(slots, Figure) else measured("slots", slots)
    n = round(slots.value)
    share = queued_waits(sent, n)
    expected, held_bound = s.value * share, (s.value + d.value / 2) * share
    nobody_waits = f"{sent} requests for {n} slots: none has to wait for one"
    return Expectation(
        f"{sent} requests at once on {n} predict slots: all preprocess, those beyond {n} wait for a slot",
        (
            condition(
                f"all {sent} were downloaded, preprocessed and inferred",
                all(count.value == sent for count in counts),
                *counts,
            ),
            *unless_each(
                sent > n,
                nobody_waits,
                condition(
                    f"the {sent - n} beyond the {n} slots waited for one: W at least (S x {share:.2f}) / 2",
                    wait.value >= expected / 2,
                    wait,
                    s,
                    slots,
                    detail=f"(S x {share:.2f}) / 2 = {expected / 2:.1f} ms",
                ),
                condition(
                    f"they waited for inferences, not for downloads: W below (S + D / 2) x {share:.2f}",
                    wait.value < held_bound,
                    wait,
                    s,
                    d,
                    detail=f"(S + D / 2) x {share:.2f} = {held_bound:.1f} ms",
                ),
            ),
        ),
        reason="W counts every wait after the download until a slot takes the request (the event loop "
        "handing it to the slots, then the jobs ahead of it; the slot itself decodes the photo): a burst of "
        "more requests than slots, or a busy machine, stretches it; condition 3 tells the designs apart "
        "only with a download D long beside S",
        estimate=Estimate(f"the mean slot wait W of the {sent} requests", wait.value, "ms"),
    )


def stage_count(run: RunResult | None, name: str, label: str):
    """How many requests of `run` went through one of the service's stages, as a figure."""
    return figure(run, f"service_stats.stage_counts.{name}", label)
