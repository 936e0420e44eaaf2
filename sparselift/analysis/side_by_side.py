"""The verdict of a side-by-side file (`profiler.side_by_side`): plans run in turns in one job of
a user's own trainer, compared round by round as `compare` pairs a side-by-side profile's turns.

Each round ran every contender once, seconds apart, in the same processes; the round's ratio of
the two contenders' median steps (slowest rank) is free of what changes between rounds, and the
verdict is the median of those ratios with the rounds bootstrapped (`compare.ab_interval`, as
`tune`'s A/B: with several models of a plan, every pair of models).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from sparselift.analysis.compare import SteadySteps, Verdict, ab_interval
from sparselift.errors import UserError
from sparselift.jsonfile import MAX_SECONDS, read_versioned

# as sparselift.profiler.side_by_side writes it (not imported: the profiler pulls in torch)
FORMAT, VERSION = "sparselift-side-by-side", 1
FILE = "side_by_side.json"
MIN_ROUNDS = 3  # fewer rounds than this cannot carry an interval


def read_side_by_side(path: str | Path) -> dict[str, list[list[float]]]:
    """Each contender's step times (slowest rank), round by round, in the file's order.

    Raises:
        UserError: the file is missing, malformed, of another format or version, or its
            contenders or step times are not as the profiler writes them; one line naming the
            file and the field.
    """
    doc = read_versioned(path, FORMAT, VERSION, "side-by-side file")
    names, steps = doc.get("contenders"), doc.get("step_s")
    if not (
        isinstance(names, list)
        and len(names) >= 2
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    ):
        raise UserError(f"{path}: contenders must be a list of 2 or more distinct names")
    if not isinstance(steps, dict) or set(steps) != set(names):
        raise UserError(f"{path}: step_s must hold the step times of each contender, by name")
    out: dict[str, list[list[float]]] = {}
    for n in names:
        rounds = steps[n]
        if not (
            isinstance(rounds, list)
            and rounds
            and all(isinstance(r, list) and r and all(_seconds(s) for s in r) for r in rounds)
        ):
            raise UserError(
                f"{path}: step_s.{n} must be a list of rounds, each a list of step times in "
                f"seconds (> 0, at most {MAX_SECONDS:g})"
            )
        out[n] = rounds
    counts = {n: len(r) for n, r in out.items()}
    if len(set(counts.values())) > 1:
        raise UserError(f"{path}: the contenders ran different numbers of rounds: {counts}")
    return out


def compare_side_by_side(
    path: str | Path,
    names: tuple[list[str], list[str]] | None = None,
    confidence: float = 0.95,
) -> Verdict:
    """The verdict on a side-by-side file's candidate against its baseline.

    Args:
        path: the side-by-side file, or the directory that holds it.
        names: the baseline's and the candidate's contenders: one each, or several models of
            each plan (built apart, as `tune`'s A/B trains two of each: a model's offset, where
            its memory landed, is the same in every round, and only another model shows it);
            None: the first two recorded.
        confidence: of each pair's interval.
    Returns:
        The Verdict, paired over the file's rounds (`compare.ab_interval`: per round the
        geometric mean of the candidate's models' steps/s over the baseline's; the interval
        spans every candidate model's against every baseline model's).
    Raises:
        UserError: a bad file (`read_side_by_side`), a directory without one, a name it does
            not hold or names on both sides, fewer than MIN_ROUNDS rounds, or a confidence
            outside (0, 1).
    """
    if not 0.0 < confidence < 1.0:
        raise UserError(f"--confidence must be between 0 and 1, got {confidence}")
    if Path(path).is_dir():  # the directory given to side_by_side
        if not Path(path, FILE).is_file():
            raise UserError(
                f"{path}: no {FILE} in it; compare takes two profiles, or one side-by-side file"
            )
        path = Path(path, FILE)
    rounds = read_side_by_side(path)
    base, cand = names if names is not None else ([n] for n in tuple(rounds)[:2])
    if not base or not cand:
        raise UserError(f"{path}: name at least one contender for the baseline and the candidate")
    for n in (*base, *cand):
        if n not in rounds:
            raise UserError(f"{path}: no contender named {n!r} (it holds {', '.join(rounds)})")
    both = sorted(set(base) & set(cand))
    if both:
        raise UserError(f"{path}: {both[0]!r} is both a baseline and a candidate contender")
    if len(rounds[base[0]]) < MIN_ROUNDS:
        raise UserError(
            f"{path}: {len(rounds[base[0]])} rounds; a verdict needs at least {MIN_ROUNDS}"
        )

    def per_round_rate(n: str) -> list[float]:
        return [1.0 / statistics.median(turn) for turn in rounds[n]]

    ratios, ratio, low, high = ab_interval(
        [per_round_rate(n) for n in cand], [per_round_rate(n) for n in base], confidence
    )

    def steps(group: list[str]) -> SteadySteps:
        flat = [s for n in group for turn in rounds[n] for s in turn]
        return SteadySteps(f"{path} [{', '.join(group)}]", flat, "side by side in one job")

    return Verdict(
        steps(base), steps(cand), ratio, low, high, confidence, paired_rounds=len(ratios)
    )


def _seconds(v: Any) -> bool:
    return (
        isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
        and 0 < v <= MAX_SECONDS
    )
