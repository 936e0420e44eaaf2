"""Is the candidate faster? A verdict on two profiles of the same job, with a confidence interval.

A plan is worth shipping only when it is *measured* faster, and "faster" must survive the noise of
a shared host. The verdict therefore compares the steady steps of the two profiles (the steps after
the profiled window, which run as unprofiled steps do; the window's own steps only when a profile
has none after it) and gives a bootstrap interval of the ratio of their medians. The candidate is
called faster only when the interval's lower end is above 1.

Two profiles of one side-by-side job (`profile --also`) took their steady steps in turns of the
same rounds, so each round pairs them under one host state: the verdict is then the median of the
rounds' ratios, with the rounds bootstrapped (`ratio_interval`). A host's speed drifts between
rounds by more than most plans differ, and pairing takes that drift out of the ratio.

A user's own trainer runs two plans in one job with `profiler.side_by_side`, whose file
`analysis.side_by_side` compares the same way. Where it cannot (the two models do not fit in
memory at once), separate jobs of one plan differ by more than the steps of one job do: several
pairs of jobs, each baseline and candidate run back to back (`compare_jobs`), are compared the
same way, the median of the pairs' ratios, the pairs bootstrapped, so the spread between jobs
is in the interval.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sparselift.analysis.profile import read_manifest
from sparselift.errors import UserError

RESAMPLES = 4000  # bootstrap resamples of each profile's steps, or of the paired rounds
MIN_STEPS = 3  # fewer steady steps than this cannot carry an interval


@dataclass(frozen=True)
class SteadySteps:
    """One profile's step times (slowest rank per step) that the verdict compares.

    Attributes:
        profile: the profile directory.
        steps_s: seconds per step, slowest rank, in step order.
        where: "after the window" (steady steps) or "in the window" (profiled, inflated).
    """

    profile: str
    steps_s: list[float]
    where: str

    @property
    def median_s(self) -> float:
        """The median step time in seconds."""
        return statistics.median(self.steps_s)


@dataclass(frozen=True)
class Verdict:
    """The measured ratio baseline ÷ candidate (above 1: the candidate is faster) and its interval.

    Attributes:
        baseline, candidate: the steps compared.
        ratio: median baseline step ÷ median candidate step; paired: the median of the rounds'
            ratios of their turns' medians.
        low, high: the `confidence` bootstrap interval of `ratio`.
        confidence: e.g. 0.95.
        paired_rounds: the side-by-side rounds the ratio pairs (0: the steps unpaired).
        paired_jobs: the pairs of separate jobs the ratio pairs (0: one pair; `baseline` and
            `candidate` are then the first pair's).
    """

    baseline: SteadySteps
    candidate: SteadySteps
    ratio: float
    low: float
    high: float
    confidence: float
    paired_rounds: int = 0
    paired_jobs: int = 0

    @property
    def candidate_faster(self) -> bool:
        """True only when the whole interval lies above 1."""
        return self.low > 1.0

    @property
    def candidate_slower(self) -> bool:
        """True when the whole interval lies below 1."""
        return self.high < 1.0

    def summary(self) -> str:
        """One line: the ratio, its interval and what it means."""
        pct = f"{self.confidence:.0%}"
        what = (
            "the candidate is measured faster"
            if self.candidate_faster
            else "the candidate is measured slower: keep the baseline"
            if self.candidate_slower
            else f"no difference measured at {pct}: keep the baseline"
        )
        over = f", paired over {self.paired_rounds} rounds" if self.paired_rounds else ""
        over += f", paired over {self.paired_jobs} pairs of jobs" if self.paired_jobs else ""
        return (
            f"measured ratio {self.ratio:.3f}x (baseline step / candidate step{over}; {pct} "
            f"interval {self.low:.3f}-{self.high:.3f}): {what}"
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record of the verdict."""
        return {
            "format": "sparselift-compare",
            "version": 1,
            **asdict(self),
            "candidate_faster": self.candidate_faster,
        }


def slowest_rank_steps(m: dict[str, Any]) -> list[float]:
    """Every recorded step's time on its slowest rank (`step_times_s[rank][step]`), [] when the
    manifest has none."""
    per_rank = m.get("step_times_s") or []
    if not per_rank or not all(isinstance(r, list) and r for r in per_rank):
        return []
    n = min(len(r) for r in per_rank)
    return [max(float(r[i]) for r in per_rank) for i in range(n)]


def after_window(m: dict[str, Any]) -> list[float]:
    """Steps timed after the profiled window, slowest rank: the profiler's own `steady_step_s`
    where it recorded them, else the training loop's step times past the window; [] if none."""
    steady = m.get("steady_step_s")
    if isinstance(steady, list) and steady:
        return [float(x) for x in steady]
    warmup, window = int(m.get("warmup", 0)), len(m.get("profiled_steps") or [])
    return slowest_rank_steps(m)[warmup + window :]


def steady_steps(profile: str | Path) -> SteadySteps:
    """The steady step times of a profile directory, read from its manifest.

    Raises:
        UserError: not a profile, or fewer than MIN_STEPS steps to compare.
    """
    d = Path(profile)
    m = read_manifest(d)
    slowest = slowest_rank_steps(m)
    if not slowest:
        raise UserError(f"{d / 'manifest.json'}: no step times (step_times_s) to compare")
    after = after_window(m)
    if len(after) >= MIN_STEPS:
        return SteadySteps(str(d), after, "after the window")
    warmup, window = int(m.get("warmup", 0)), len(m.get("profiled_steps") or [])
    inside = slowest[warmup : warmup + window]
    if len(inside) < MIN_STEPS:
        raise UserError(
            f"{d}: {len(inside)} profiled and {len(after)} later steps; a comparison needs at "
            f"least {MIN_STEPS} (profile more --steps or --after)"
        )
    return SteadySteps(str(d), inside, "in the window")


def check_same_job(baseline: str | Path, candidate: str | Path) -> None:
    """Refuse two profiles of different jobs: the model's tables (rows, dim, features, weight
    type), batch size or world size differ. A split plan's profile is of its model's tables
    (the manifest's `model_tables`), not of the virtual tables it sharded.

    Raises:
        UserError: one line naming both profiles and the first difference.
    """
    a, b = read_manifest(Path(baseline)), read_manifest(Path(candidate))

    def tables(m: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        return {
            t["name"]: (
                t.get("num_embeddings"),
                t.get("embedding_dim"),
                tuple(t.get("feature_names") or ()),
                t.get("data_type") or "fp32",
            )
            for t in m.get("model_tables") or m.get("tables") or []
        }

    ta, tb = tables(a), tables(b)
    diff = None
    for key in ("workload", "world_size", "batch_size"):
        if a.get(key) != b.get(key):
            diff = f"{key} {a.get(key)!r} vs {b.get(key)!r}"
            break
    if diff is None and set(ta) != set(tb):
        only = sorted(set(ta) ^ set(tb))[0]
        diff = f"table {only!r} is in only one of them"
    if diff is None:
        name = next((n for n in sorted(ta) if ta[n] != tb[n]), None)
        if name is not None:
            diff = f"table {name!r}: (rows, dim, features, weights) {ta[name]} vs {tb[name]}"
    if diff is not None:
        raise UserError(f"{baseline} and {candidate} are profiles of different jobs: {diff}")


def compare_profiles(
    baseline: str | Path, candidate: str | Path, confidence: float = 0.95, seed: int = 0
) -> Verdict:
    """The verdict on `candidate` against `baseline`, two profiles of the same job.

    Profiles of one side-by-side job whose steady steps are its turns (`paired_turns`) are
    compared round by round (`ratio_interval`). Otherwise the interval resamples each profile's
    steps with replacement (RESAMPLES times) and takes the ratio of the medians. Both use a
    fixed seed, so the same profiles give the same verdict.

    Raises:
        UserError: different jobs, too few steps, or a confidence outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise UserError(f"--confidence must be between 0 and 1, got {confidence}")
    check_same_job(baseline, candidate)
    base, cand = steady_steps(baseline), steady_steps(candidate)
    turns = paired_turns(baseline, candidate)
    if turns is not None:
        b, c = turns
        rounds = [statistics.median(x) / statistics.median(y) for x, y in zip(b, c, strict=True)]
        ratio, low, high = ratio_interval(rounds, confidence, seed)
        return Verdict(base, cand, ratio, low, high, confidence, paired_rounds=len(rounds))
    rng = np.random.default_rng(seed)
    xb, xc = np.array(base.steps_s), np.array(cand.steps_s)
    mb = np.median(rng.choice(xb, size=(RESAMPLES, len(xb))), axis=1)
    mc = np.median(rng.choice(xc, size=(RESAMPLES, len(xc))), axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(mb / mc, [tail, 1.0 - tail])
    return Verdict(
        baseline=base,
        candidate=cand,
        ratio=base.median_s / cand.median_s,
        low=float(low),
        high=float(high),
        confidence=confidence,
    )


def compare_jobs(
    pairs: list[tuple[str | Path, str | Path]], confidence: float = 0.95, seed: int = 0
) -> Verdict:
    """The verdict on the candidate plan from `pairs` of separate jobs (baseline, candidate),
    each pair run back to back: the median of the pairs' ratios of their steady medians, with
    the pairs bootstrapped (`ratio_interval`).

    Raises:
        UserError: fewer than MIN_STEPS pairs, profiles of different jobs (every profile is
            checked against the first baseline), too few steps, or a bad confidence.
    """
    if not 0.0 < confidence < 1.0:
        raise UserError(f"--confidence must be between 0 and 1, got {confidence}")
    if len(pairs) < MIN_STEPS:
        raise UserError(
            f"{len(pairs)} pair(s) of jobs: an interval over jobs needs at least {MIN_STEPS} "
            f"(add pairs with --also BASELINE CANDIDATE)"
        )
    first = pairs[0][0]
    for b, c in pairs:
        for other in (b, c) if b != first else (c,):
            check_same_job(first, other)
    steps = [(steady_steps(b), steady_steps(c)) for b, c in pairs]
    ratio, low, high = ratio_interval([b.median_s / c.median_s for b, c in steps], confidence, seed)
    return Verdict(*steps[0], ratio, low, high, confidence, paired_jobs=len(pairs))


def spanning(verdicts: list[Verdict]) -> Verdict:
    """The first of `verdicts` (one candidate against several models of the baseline plan) with
    its interval widened to span every one's: the lowest low end and the highest high end.

    Why: two models of one plan in one side-by-side job step apart by where their memory
    landed, by the same share every round, so no one pair's rounds show it; the candidate is
    faster only where it is faster than every model.
    """
    return replace(
        verdicts[0], low=min(v.low for v in verdicts), high=max(v.high for v in verdicts)
    )


def job_models(candidate: str | Path, twins: list[str]) -> list[str]:
    """Those of `twins` (profiles of the baseline plan: models of it) profiled in `candidate`'s
    side-by-side job, in order; none where `candidate` was not profiled side by side."""
    job = read_manifest(Path(candidate)).get("side_by_side_job")
    return [t for t in twins if job and read_manifest(Path(t)).get("side_by_side_job") == job]


def paired_turns(
    baseline: str | Path, candidate: str | Path
) -> tuple[list[list[float]], list[list[float]]] | None:
    """Both profiles' steady steps as their turns, round by round, where they pair: profiles of
    one side-by-side job (`side_by_side_job`) with turns of the same length (`steady_turn_steps`),
    the same number of them, and at least MIN_STEPS rounds; otherwise None."""
    a, b = read_manifest(Path(baseline)), read_manifest(Path(candidate))
    job, n = a.get("side_by_side_job"), a.get("steady_turn_steps")
    sa, sb = a.get("steady_step_s") or [], b.get("steady_step_s") or []
    if (
        not job
        or not n
        or (b.get("side_by_side_job"), b.get("steady_turn_steps")) != (job, n)
        or len(sa) != len(sb)
        or len(sa) % n
        or len(sa) // n < MIN_STEPS
    ):
        return None

    def turns(steps: list[Any]) -> list[list[float]]:
        return [[float(x) for x in steps[i : i + n]] for i in range(0, len(steps), n)]

    return turns(sa), turns(sb)


def ratio_interval(
    ratios: list[float], confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(median, low, high) of per-round ratios; the `confidence` interval bootstraps the rounds
    (RESAMPLES times, seeded).

    Rounds pair two plans under the same host state, so each round's own ratio is the unit.
    """
    x = np.array(ratios)
    boot = np.median(np.random.default_rng(seed).choice(x, size=(RESAMPLES, len(x))), axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(boot, [tail, 1.0 - tail])
    return statistics.median(ratios), float(low), float(high)


def ab_interval(
    candidates: list[list[float]], baselines: list[list[float]], confidence: float = 0.95
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
