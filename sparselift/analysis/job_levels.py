"""Level the speeds of separate jobs before their profiles are fitted together.

Profiles of one side-by-side job are timed at that job's speed; a separate job of the same plans
on a shared host can run up to 2× slower or faster as a whole (where its threads landed, what
else ran). Fitted together unlevelled, such jobs tell the fit a plan is slow that only ran in a
slow job. A plan profiled in two jobs measures their ratio: each job's *level* is its steps ÷
the same steps in the first profile's job, carried from job to job through the plans they share
(`tune` profiles the baseline in every job for this). A job that shares no plan with the first's
keeps level 1: it is fitted as measured, and `JobLevel.linked` says so.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import deque
from dataclasses import dataclass

from sparselift.analysis.evidence import ProfileEvidence, slowed

PLAN_KEYS = ("sharding", "splits", "comm_precision", "pipeline")  # the manifest's plan in force


@dataclass(frozen=True)
class JobLevel:
    """One profile's job, and that job's speed against the first profile's.

    Attributes:
        profile: the profile directory.
        job: its job (`job_of`).
        level: its job's steps ÷ the same steps in the first profile's job (1.0 there).
        linked: whether a shared plan measured the level (False: 1.0 is assumed).
        via: the plan profiles the level was measured from, "A / B" per link (empty at 1.0).
    """

    profile: str
    job: str
    level: float
    linked: bool
    via: tuple[str, ...] = ()


def job_of(ev: ProfileEvidence) -> str:
    """The job `ev` ran in: its side-by-side job's id; for a side-by-side profile written before
    jobs had ids, its job's plans; else (a job of its own) the profile directory."""
    m = ev.manifest
    if m.get("side_by_side_job"):
        return str(m["side_by_side_job"])
    plans = m.get("side_by_side_plans")
    return json.dumps(plans) if plans else ev.profile


def plan_of(ev: ProfileEvidence) -> str:
    """What identifies the plan `ev` trained with (its manifest's sharding, splits, precision
    and pipeline), as one comparable string."""
    return json.dumps([ev.manifest.get(k) for k in PLAN_KEYS], sort_keys=True)


def job_levels(evidence: list[ProfileEvidence]) -> list[JobLevel]:
    """Each profile's job level (see the module's docstring), in `evidence`'s order.

    Two jobs that profiled the same plan are linked by the median, over the plans they share,
    of that plan's target step in one ÷ in the other; a plan profiled as several models in one
    job counts at their geometric mean: models of one plan run apart (where their memory
    landed), and one model alone would carry its offset into every level. Levels multiply
    along links, breadth first from the first profile's job.
    """
    jobs = [job_of(ev) for ev in evidence]
    models: dict[tuple[str, str], list[ProfileEvidence]] = {}  # (job, plan) → its profiles
    for job, ev in zip(jobs, evidence, strict=True):
        models.setdefault((job, plan_of(ev)), []).append(ev)
    step = {
        key: statistics.geometric_mean(ev.target_s for ev in evs) for key, evs in models.items()
    }
    name = {key: " + ".join(ev.profile for ev in evs) for key, evs in models.items()}
    links: dict[str, dict[str, tuple[float, tuple[str, ...]]]] = {j: {} for j in jobs}
    for a in dict.fromkeys(jobs):
        for b in dict.fromkeys(jobs):
            shared = [p for (j, p) in models if j == a and a != b and (b, p) in models]
            if shared:
                ratio = statistics.median(step[(b, p)] / step[(a, p)] for p in shared)
                links[a][b] = (ratio, tuple(f"{name[(a, p)]} / {name[(b, p)]}" for p in shared))
    level: dict[str, tuple[float, tuple[str, ...]]] = {jobs[0]: (1.0, ())}
    queue = deque([jobs[0]])
    while queue:
        a = queue.popleft()
        for b, (ratio, via) in links[a].items():
            if b not in level:
                level[b] = (level[a][0] * ratio, level[a][1] + via)
                queue.append(b)
    return [
        JobLevel(ev.profile, j, level.get(j, (1.0, ()))[0], j in level, level.get(j, (1.0, ()))[1])
        for j, ev in zip(jobs, evidence, strict=True)
    ]


def levelled(evidence: list[ProfileEvidence], levels: list[JobLevel]) -> list[ProfileEvidence]:
    """`evidence` at the first profile's job's speed: each profile's durations (`slowed`) and
    its batch transform's and recombination's timings ÷ its job's level in `levels` (those of
    the profiles the levels were measured on; a profile of a job they do not name is left as
    measured)."""
    out = []
    for ev in evidence:
        f = 1.0 / level_of(levels, ev)
        if f != 1.0:
            ev = dataclasses.replace(
                slowed(ev, f),
                transform=[dataclasses.replace(t, seconds=t.seconds * f) for t in ev.transform],
                recombine=[dataclasses.replace(r, seconds=r.seconds * f) for r in ev.recombine],
            )
        out.append(ev)
    return out


def level_of(levels: list[JobLevel], ev: ProfileEvidence) -> float:
    """The level of `ev`'s job in `levels` (1.0 for a job they do not name)."""
    job = job_of(ev)
    return next((lv.level for lv in levels if lv.job == job), 1.0)
