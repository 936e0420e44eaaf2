"""`tune`'s A/B: which plan it tries, candidate vs baseline trained side by side in one job, and
the verdict.

Each plan trains as AB_MODELS models (built candidate, baseline, baseline, candidate: neither
plan always built first), because two models of one plan in one job step apart by where their
memory landed, by the same share in every round, which the rounds of one pair cannot show. The
candidate ships only when the low end of the interval of the measured ratio, against every
model of the baseline in each of its own models, is above 1.

Where the first job leaves the verdict open (the median ratio above 1, the interval's low end
not), a second job of more rounds (by default SECOND_JOB_SCALE times the first's) is run and
the rounds of both are judged together: a gain that 8 rounds cannot resolve from the host's
noise is then shipped more often. Each of the two looks takes a (1 − (1 − CONFIDENCE) / 2)
interval, so that both together keep CONFIDENCE (Bonferroni): looking twice does not ship a
plan that is no faster more often than one look.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparselift.analysis.compare import ab_interval
from sparselift.atomic import write_json
from sparselift.bench import BenchResult, Contender, run_bench
from sparselift.workloads.harness import MAX_ROUNDS, TrainConfig

CONFIDENCE = 0.95  # of the verdict, over every look at the A/B's rounds together
AB_MODELS = 2
SECOND_JOB_SCALE = 2  # the second job's rounds, by default, per round of the first


def second_job_rounds(rounds: int, more_rounds: int | None) -> int:
    """The rounds of the A/B's second job: `more_rounds` where given, else SECOND_JOB_SCALE ×
    `rounds`, at most the harness's MAX_ROUNDS.

    Why more than the first job's: the second job runs only where the first left the verdict
    open, where the gain is near the host's noise; twice the rounds there ships such a gain
    up to twice as often, and a plan that is no faster no more often (benchmarks/README.md,
    "A second A/B job of twice the rounds")."""
    return min(SECOND_JOB_SCALE * rounds, MAX_ROUNDS) if more_rounds is None else more_rounds


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
            (`compare.ab_interval`).
        confidence: that interval's (each look's: `look_confidence`).
        jobs: the jobs the rounds ran in (2 where the first left the verdict open).
        shipped: "candidate" or "baseline".
        reason: one line saying why.
    """

    ratios: list[float]
    ratio: float
    low: float
    high: float
    shipped: str
    reason: str
    confidence: float = CONFIDENCE
    jobs: int = 1


def look_confidence(looks: int) -> float:
    """The confidence of each of `looks` looks at an A/B's rounds, so that the verdict over all
    of them keeps CONFIDENCE (Bonferroni)."""
    return 1.0 - (1.0 - CONFIDENCE) / looks


def run_ab(
    cfg: TrainConfig,
    work: Path,
    candidate: str,
    baseline: str,
    rounds: int,
    echo: Callable[[str], None],
    more_rounds: int = 0,
    bench: Callable[..., BenchResult] = run_bench,
) -> ABVerdict:
    """Measure `candidate` against `baseline` (plan files), each as AB_MODELS models side by
    side in one job of `cfg` (its hook included) for `rounds` rounds; where that leaves the
    verdict open and `more_rounds` > 0, in a second such job for `more_rounds` rounds, judged
    with the first job's rounds.

    Args:
        bench: runs one job (`bench.run_bench`; tests pass their own).
    Returns:
        The verdict; the runs are written as `work`/bench.json, and the second job's as
        `work`/bench-2.json (the `sparselift bench --json` format).
    Raises:
        As `bench.run_bench` (a rank that fails).
    """
    cfg = dataclasses.replace(cfg, progress=False)
    confidence = look_confidence(2 if more_rounds > 0 else 1)
    cands: list[list[float]] = [[] for _ in range(AB_MODELS)]
    bases: list[list[float]] = [[] for _ in range(AB_MODELS)]

    def job(n: int, name: str) -> tuple[BenchResult, tuple[list[float], float, float, float]]:
        """One job of `n` rounds (written to `work`/`name`), judged with the jobs before it."""
        c = [Contender(_model("candidate", k), candidate) for k in range(AB_MODELS)]
        b = [Contender(_model("baseline", k), baseline) for k in range(AB_MODELS)]
        result = bench(cfg, [c[0], *b, *c[1:]], n, echo=lambda s: echo(f"tune: A/B {s}"))
        write_json(work / name, result.to_json())
        for into, got in zip([*cands, *bases], [*c, *b], strict=True):
            into.extend(got.steps_per_s)
        return result, ab_interval(cands, bases, confidence)

    result, (ratios, ratio, low, high) = job(rounds, "bench.json")
    jobs_run = 1
    if more_rounds > 0 and low <= 1.0 < ratio:  # open: faster at the median, not past noise
        echo(
            f"tune: A/B undecided after {rounds} rounds ({ratio:.3f}x, {confidence:.1%} "
            f"interval {low:.3f}-{high:.3f}): {more_rounds} more rounds in a second job"
        )
        result, (ratios, ratio, low, high) = job(more_rounds, "bench-2.json")
        jobs_run = 2
    where = result.runs if jobs_run == 1 else f"side by side in {jobs_run} jobs"
    measured = (
        f"measured {ratio:.3f}x over the baseline ({confidence:.1%} interval "
        f"{low:.3f}-{high:.3f} over every pair of their {AB_MODELS} models each, "
        f"{len(ratios)} rounds {where})"
    )
    shipped = "candidate" if low > 1.0 else "baseline"
    verdict = "shipped it" if low > 1.0 else "not measured faster, kept the baseline"
    reason = f"SparseLift's plan {measured}: {verdict}"
    return ABVerdict(ratios, ratio, low, high, shipped, reason, confidence, jobs_run)


def _model(plan: str, k: int) -> str:
    """The bench label of model `k` of `plan` in the A/B."""
    return plan if k == 0 else f"{plan}, model {k + 1}"
