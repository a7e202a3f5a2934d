"""How many senders notebook 8's runs use: enough to keep one slot busy with the download
outside it (`enough_senders`), from the service's own means in a run with one sender.
"""

from __future__ import annotations

import math

from servelab.results import RunResult


def enough_senders(alone: RunResult, at_least: int = 1, at_most: int = 128) -> int:
    """Senders that keep one slot busy with the download outside it: half again (D + decoding + S) / S,
    from the service's means in `alone`, a run with one sender; at least `at_least`, at most `at_most`.
    Each request spends D + decoding + S in flight and S in the slot, so about (D + decoding + S) / S
    must be in flight for one of them to be in the slot at any moment."""
    if alone.service_stats is None:
        raise ValueError(f"{alone.name} has no service statistics: measure it with service_stats=True")
    stages = alone.service_stats["stage_mean_ms"]
    needed = math.ceil(1.5 * (stages["download"] + stages["preprocess"] + stages["inference"]) / stages["inference"])
    return max(at_least, min(at_most, needed))
