"""`tune`'s A/B: which plan it tries, candidate vs baseline trained side by side in one job, and
the verdict.

Each plan trains as AB_MODELS models (built candidate, baseline, baseline, candidate: neither
plan always built first), because two models of one plan in one job step apart by where their
memory landed, by the same share in every round, which the rounds of one pair cannot show. The
candidate ships only when the low end of the interval of the measured ratio, against every
model of the baseline in each of its own models, is above 1.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparselift.analysis.compare import ratio_interval
from sparselift.atomic import write_json
from sparselift.bench import Contender, run_bench
from sparselift.workloads.harness import TrainConfig

CONFIDENCE = 0.95
AB_MODELS = 2


def fastest_beside_baseline(beside: list[tuple[str, float, float]], ended_at: str) -> str:
    """The plan the A/B tries: of the plans the loop profiled beside the baseline, the one that
    ran fastest against it in its job, where any ran faster than it; else `ended_at`, the plan
    the loop ended at.

    Why: the loop ends where the model stops changing its mind, but each iteration also measured
    its plan beside the baseline; a plan the model came to prefer that measured slower than an
    earlier one is not the one to try. The A/B measures the choice again, on its own.

    Args:
        beside: per plan profiled beside the baseline: (plan, its median step, the baseline's
            median step in the same job).
        ended_at: the plan the loop ended at.
    """
    faster = [(base_s / step_s, plan) for plan, step_s, base_s in beside if step_s < base_s]
    return max(faster)[1] if faster else ended_at


@dataclass
class ABVerdict:
    """The A/B's outcome.

    Attributes:
        ratios: per round, the geometric mean of the candidate's models' steps/s over that of
            the baseline's.
        ratio, low, high: their median, and the interval over every pair of models
            (`ab_interval`).
        shipped: "candidate" or "baseline".
        reason: one line saying why.
    """

    ratios: list[float]
    ratio: float
    low: float
    high: float
    shipped: str
    reason: str


def run_ab(
    cfg: TrainConfig,
    work: Path,
    candidate: str,
    baseline: str,
    rounds: int,
    echo: Callable[[str], None],
) -> ABVerdict:
    """Measure `candidate` against `baseline` (plan files), each as AB_MODELS models side by
    side in one job of `cfg` (its hook included) for `rounds` rounds.

    Returns:
        The verdict; the runs are written as `work`/bench.json (the `sparselift bench --json`
        format).
    Raises:
        As `bench.run_bench` (a rank that fails).
    """
    cfg = dataclasses.replace(cfg, progress=False)
    cands = [Contender(_model("candidate", k), candidate) for k in range(AB_MODELS)]
    bases = [Contender(_model("baseline", k), baseline) for k in range(AB_MODELS)]
    order = [cands[0], *bases, *cands[1:]]
    bench = run_bench(cfg, order, rounds, echo=lambda s: echo(f"tune: A/B {s}"))
    write_json(work / "bench.json", bench.to_json())
    ratios, ratio, low, high = ab_interval(
        [c.steps_per_s for c in cands], [b.steps_per_s for b in bases]
    )
    measured = (
        f"measured {ratio:.3f}x over the baseline ({CONFIDENCE:.0%} interval "
        f"{low:.3f}-{high:.3f} over every pair of their {AB_MODELS} models each, "
        f"{rounds} rounds {bench.runs})"
    )
    shipped = "candidate" if low > 1.0 else "baseline"
    verdict = "shipped it" if low > 1.0 else "not measured faster, kept the baseline"
    return ABVerdict(ratios, ratio, low, high, shipped, f"SparseLift's plan {measured}: {verdict}")


def _model(plan: str, k: int) -> str:
    """The bench label of model `k` of `plan` in the A/B."""
    return plan if k == 0 else f"{plan}, model {k + 1}"


def ab_interval(
    candidates: list[list[float]], baselines: list[list[float]], confidence: float = CONFIDENCE
) -> tuple[list[float], float, float, float]:
    """The A/B's per-round ratios, their median, and an interval that holds for every model.

    Args:
        candidates, baselines: each model's steps/s per round (every plan trained as several
            models side by side in one job).
        confidence: of each pair's interval.
    Returns:
        (ratios, median, low, high): per round, the geometric mean of the candidate's models'
        steps/s over that of the baseline's; their median; the lowest low end and the highest
        high end of the `confidence` intervals (`ratio_interval`) of every candidate model
        against every baseline model.

    Why every pair: a model's offset (where its memory landed) is the same in every round, so
    the rounds of one pair cannot show it, while a pair of other models can. The candidate ships
    only when it is faster than every model of the baseline, in each of its own models.
    """
    pairs = [
        ratio_interval([x / y for x, y in zip(c, b, strict=True)], confidence)
        for c in candidates
        for b in baselines
    ]
    ratios = [
        statistics.geometric_mean(c) / statistics.geometric_mean(b)
        for c, b in zip(zip(*candidates, strict=True), zip(*baselines, strict=True), strict=True)
    ]
    low, high = min(p[1] for p in pairs), max(p[2] for p in pairs)
    return ratios, statistics.median(ratios), low, high
