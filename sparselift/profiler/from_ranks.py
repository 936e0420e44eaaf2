"""Write profile directories in the parent process, from what the ranks of a harness job handed
back: one profile per plan of a plain job (`sparselift profile`), or one per profiled plan of a
side-by-side job (`profile_side_by_side`).

Why side by side: two jobs of the same plan on a shared host run up to 1.3–1.5× apart (where
their threads landed, their memory layout), so profiles of separate jobs calibrate each plan at
its own job's speed. Profiled in one job, in turns, every profile (and every plan measured in the
same job) shares that speed, and what differs between them is the plans.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.workloads.harness import TrainConfig
from sparselift.workloads.side_by_side import SideBySide, run_side_by_side

HOOK = "sparselift.profiler.hook:make_hook"
KERNEL_STEADY_STEPS = 10  # steps after a window whose embedding kernels are timed


def write_from_parent(
    out: Path,
    extras: list[dict[str, Any]],
    step_times_s: list[list[float]],
    peak_memory_bytes: list[int],
    side_by_side: tuple[list[str | None], list[list[float]], str] | None = None,
) -> None:
    """Write the profile from rank 0's facts and rows (`extras[0]`, its hook's `finish()`), with
    the harness's own step times and peak memory for every rank; the steady steps rank 0
    gathered are re-read from those step times (the same steps, the same timing), so the two
    agree.

    Args:
        out: the profile directory.
        extras: every rank's hook `finish()`, in rank order (their `errors` are recorded).
        step_times_s: every rank's steps of the profiled model, in its order (`[rank][step]`).
        peak_memory_bytes: every rank's peak memory.
        side_by_side: in a side-by-side job, its plans (this one included: manifest
            `side_by_side_plans`; the peak memory is then the whole job's), this plan's
            timed turns, round by round, which become `steady_step_s` (`steady_turn_steps`
            each), and the job's id (`side_by_side_job`, the same in every profile of the job);
            None: a plain job.
    Raises:
        OSError: a file cannot be written (UnwritablePathError included).
    """
    from sparselift.profiler.manifest import ProfileFacts
    from sparselift.profiler.session import write_profile

    facts = ProfileFacts(**extras[0]["facts"])
    facts.step_times_s = step_times_s
    first, n = facts.warmup + len(facts.profiled_steps), len(facts.steady_step_s)
    if side_by_side is not None:
        facts.side_by_side_plans, turns, facts.side_by_side_job = side_by_side
        facts.steady_step_s = [s for turn in turns for s in turn]
        facts.steady_turn_steps = len(turns[0]) if turns else None
    elif all(len(t) >= first + n for t in step_times_s):
        facts.steady_step_s = [max(t[i] for t in step_times_s) for i in range(first, first + n)]
    facts.peak_memory_bytes = peak_memory_bytes
    facts.errors = [f"rank {r}: {e}" for r, x in enumerate(extras) for e in x.get("errors", [])]
    write_profile(out, extras[0]["rows"], facts)


def profile_side_by_side(
    cfg: TrainConfig,
    out_dirs: list[Path | None],
    *,
    warmup: int,
    steps: int,
    execution_trace: bool = False,
    command: list[str] | None = None,
    write: bool = True,
    hook: str = HOOK,
) -> tuple[SideBySide, list[str]]:
    """Train `cfg.contenders` side by side (`run_side_by_side`) and profile those with an out
    directory: each one's window is steps [warmup, warmup + steps) of its own, inside its
    warm-up (which is widened to hold it), so no window overlaps another contender's steps.
    A profile's `steady_step_s` are its plan's timed turns in the job's rounds: steps timed as
    every other plan of the job is, which is what a calibration must close on.

    Args:
        cfg: the side-by-side job (no hook of its own).
        out_dirs: per contender, its profile directory (prepared by the caller) or None.
        write: write the profiles here (False: on the other hosts of a job on several).
        hook: the profiler's hook factory (tests swap in one that wraps it).
    Returns:
        The SideBySide (rounds, peak memory, every step), and the errors of the profiles
        ("DIR: rank R: ..."; empty when every profile is complete).
    Raises:
        UserError: out_dirs does not match the contenders, no contender is profiled, or the job
            is refused (`run_side_by_side`).
        RankFailed: a rank failed.
    """
    if len(out_dirs) != len(cfg.contenders):
        raise UserError(
            f"{len(out_dirs)} profile directories for {len(cfg.contenders)} side-by-side plans"
        )
    if all(d is None for d in out_dirs):
        raise UserError("a side-by-side profile needs at least one profiled plan")
    job = dataclasses.replace(
        cfg,
        warmup=max(cfg.warmup, warmup + steps),
        hook=hook,
        hook_args=dict(
            out_dir=[None if d is None else str(d) for d in out_dirs],
            warmup=warmup,
            steps=steps,
            execution_trace=execution_trace,
            command=command,
            # the steps after its window time the kernels (`lookup_s`); the rounds' turns are
            # its steady steps
            steady_steps=KERNEL_STEADY_STEPS,
        ),
    )
    measured = run_side_by_side(job)
    job_id = uuid.uuid4().hex  # one per job: profiles of separate jobs ran at their own speed
    errors: list[str] = []
    for c, out in enumerate(out_dirs):
        if out is None or not write:
            continue
        extras = measured.hooks[c]
        if "facts" not in extras[0]:
            errors.append(f"{out}: rank 0 returned no statistics")
            continue
        errors += [f"{out}: rank {r}: {e}" for r, x in enumerate(extras) for e in x["errors"]]
        try:
            write_from_parent(
                out,
                extras,
                measured.rank_steps_s[c],
                measured.peak_memory_bytes,
                (job.contenders, measured.step_times_s[c], job_id),
            )
        except OSError as e:
            errors.append(f"writing {out}: {e}")
    return measured, errors
