"""Close the loop on the harness: plan, measure, re-plan, and ship only what measured faster.

`tune` profiles the baseline plan (TorchRec's, unless one is given) under each train pipeline (the
pair calibrates what the sparse-dist pipeline hides), at 16-bit comm precision (what 16-bit
collectives cost), with its largest table row-wise (what a reduce-scatter costs), with its smallest
tables data-parallel (what the dense TBE's backward, their all-reduce and the optimizer's pass over
them cost) and under the base pipeline again as a second model (two models of one plan step apart by
where their memory landed: the pipeline and 16 bits must beat both, `compare.spanning`), all side by
side in one job (`profile --also`: their steps are timed at one job's speed, so they differ by the
plans alone); it plans from that calibration (trying a plan predicted `TRY_GAIN` faster than the
profiled one, and a split that much faster than the best plan without: lower bars than a plan
shipped unmeasured needs, as the profile and the A/B measure it), profiles the candidate the same
way with the baseline beside it (separate jobs run at their own speed: the plan both ran levels
them, `analysis.job_levels`), recalibrates on every profile so far together (`analysis.joint`: more
plans tell more coefficients apart; a split plan's profile, of the model's tables split into virtual
ones, is fitted with the others, and the statistics are read from one without splits), re-plans, and
so on until the plan is a fixed point (or one already profiled) or the iteration budget is spent.
The candidate is the plan that ran fastest beside the baseline where any ran faster, else the plan
the loop ended at. Then it measures candidate and baseline in an A/B: both trained side by side in
one job, taking turns (`workloads.side_by_side`), each plan as two models (two models of one plan
step apart by where their memory landed). The candidate is shipped only when the lower end of the
interval of the measured ratio, over every pair of models, is above 1 (where the first job leaves
that open, a second job's rounds are judged with it: `tune_ab`): a model's prediction is evidence
for trying a plan, not for shipping it.

Each step runs a `sparselift` command in-process (profile, analyze, optimize, plan: the caller
passes the CLI's entry point, so this module does not import the CLI), so it takes the same
validation and writes the same files as a user's own commands would; they live in the work
directory, and nothing is written to `out` until the verdict.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparselift.analysis.compare import steady_steps
from sparselift.analysis.split_cost_fit import median_step_costs
from sparselift.atomic import write_bytes, write_json
from sparselift.bench import MAX_ROUNDS
from sparselift.calibration_parts import unmeasured_note
from sparselift.errors import UserError
from sparselift.profile_manifest import read_manifest, shared_cores
from sparselift.tune_ab import fastest_beside_baseline, run_ab, second_job_rounds
from sparselift.tune_plans import calibration_plans, same_sharding
from sparselift.workloads.harness import MAX_STEPS, TrainConfig

STEADY_STEPS = 10  # each profile's steady steps at least (`sparselift profile`'s default)
# The predicted gain a plan needs to be tried, over the profiled plan and, with splits, over the
# best plan without: lower than `optimize` asks of a plan it ships unmeasured, since every plan
# tried here is measured and only an A/B win ships.
TRY_GAIN = 0.02
# The lines of `sparselift optimize`'s output that say what it chose and why, echoed by tune.
OPTIMIZER_VERDICTS = (
    "choices:",
    "kept ",
    "no splits",
    "pipeline ",
    "the profiled plan's splits",
    "the cheapest baseline",
    "TorchRec's plan does not fit",
    "TorchRec (",  # the plan compared with: its predicted step, and the speedup over it
    "profiled plan ",
)


class StepFailed(Exception):
    """A `sparselift` step of the loop failed; its own error line was already printed."""

    def __init__(self, what: str, code: int) -> None:
        super().__init__(f"{what} failed (exit {code})")
        self.code = code


def models_step_s(*profiles: str) -> float:
    """The steady step of one plan profiled as `profiles` (its models, side by side in one job):
    the geometric mean of their median steady steps. Models of one plan run apart by where their
    memory landed, so one alone would carry its offset into the plan's measured step and every
    comparison with it.

    Raises:
        UserError: a profile without enough steady steps (`compare.steady_steps`).
    """
    return statistics.geometric_mean(steady_steps(p).median_s for p in profiles)


@dataclass
class Iteration:
    """One profiled plan of the loop: what the model predicted for it and what it measured.

    Attributes:
        plan: the plan file profiled.
        profile: its profile directory under the plan's own pipeline.
        predicted_step_s: the step `optimize` predicted for it (None for the baseline).
        measured_step_s: its median steady step (slowest rank), at the geometric mean of its
            two models where the plan runs the base pipeline (`models_step_s`).
        next_plan: the plan `optimize` made from this profile.
        baseline_step_s: the baseline's median steady step in the same job, under the base
            pipeline (the first iteration's two models of it; later ones profile it beside the
            plan).
        held_out: the joint calibration's leave-one-out checks after this profile
            (`calibration.HeldOut` as JSON; [] while there is one base profile).
        levelled_step_s: `measured_step_s` at the speed of the job the prediction was made
            in: × the baseline's step there ÷ its step beside this plan (None for the first).
        split_costs_s: a split plan's batch transform and recombination a step, medians of its
            profile's steady steps (`split_cost_fit.median_step_costs`; None without splits).
    """

    plan: str
    profile: str
    predicted_step_s: float | None
    measured_step_s: float
    next_plan: str
    baseline_step_s: float
    held_out: list[dict[str, Any]] = field(default_factory=list)
    levelled_step_s: float | None = None
    split_costs_s: tuple[float, float] | None = None


@dataclass
class TuneResult:
    """What `tune` did and decided.

    Attributes:
        baseline, candidate: plan files (the candidate: `fastest_beside_baseline`).
        iterations: the profiled plans, in order.
        fixed_point: whether the loop stopped because re-planning gave the same plan, or one
            already profiled.
        ab_ratios: per A/B round, candidate steps/s ÷ baseline steps/s, each the geometric
            mean over its models (empty without A/B).
        ratio, low, high: the median per-round ratio and the interval over every pair of
            models (`compare.ab_interval`; None without A/B).
        confidence: that interval's; ab_jobs: the A/B's jobs (0 without A/B, 2 where the first
            left the verdict open).
        shipped: "candidate" or "baseline".
        reason: one line saying why.
    """

    baseline: str
    candidate: str
    iterations: list[Iteration] = field(default_factory=list)
    fixed_point: bool = False
    ab_ratios: list[float] = field(default_factory=list)
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    confidence: float | None = None
    ab_jobs: int = 0
    shipped: str = "baseline"
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able record (`tune.json` in the work directory)."""
        return {"format": "sparselift-tune", "version": 1, **dataclasses.asdict(self)}


Command = Callable[[list[str]], int]  # `sparselift.cli.main`: argv → exit code


def tune(
    cfg: TrainConfig,
    out: str | Path,
    work: str | Path,
    run_command: Command,
    *,
    rounds: int = 8,
    more_rounds: int | None = None,
    max_iterations: int = 3,
    profile_steps: int = 8,
    after: int = 5,
    time_limit_s: float = 30.0,
    baseline: str | None = None,
    min_gain: float = TRY_GAIN,
    ab_hook: str | None = None,
    ab_hook_args: dict[str, Any] | None = None,
    echo: Callable[[str], None] = print,
) -> TuneResult:
    """Run the loop and the A/B for `cfg`'s workload and ranks; write the shipped plan to `out`.

    Args:
        cfg: the training run (workload, ranks, row cap, batch, seed); `cfg.steps` are the A/B's
            measured steps per run.
        out: where the shipped plan goes (written once, atomically, after the verdict).
        work: a directory for the loop's plans, profiles and `tune.json`.
        run_command: runs one `sparselift` command line (`sparselift.cli.main`).
        rounds: A/B rounds (turns of `cfg.steps` steps each, side by side in one job).
        more_rounds: rounds of a second A/B job where the first leaves the verdict open
            (`tune_ab.run_ab`); None: `tune_ab.second_job_rounds`'s default (twice
            `rounds`); 0: no second job.
        max_iterations: profiles of candidate plans at most (the baseline's is extra).
        profile_steps, after: profiled steps, and steady steps timed after the window.
        time_limit_s: `optimize --time-limit`.
        baseline: a plan file to beat; None: TorchRec's plan for this workload and world size.
        min_gain: `optimize --min-gain` and `--split-margin`: how much faster the model must
            predict a new plan than the profiled one, and a plan with splits than the best plan
            without, to try it.
        ab_hook, ab_hook_args: a harness hook for the A/B runs only (tests slow one plan down).
        echo: where progress and the per-iteration figures go.
    Returns:
        The TuneResult (also in `work`/tune.json).
    Raises:
        UserError: bad arguments (before anything runs: `check_loop_args`, an unusable `work`).
        StepFailed: a step failed (its error already printed); `out` is not touched.
    """
    if not 1 <= max_iterations <= 20:
        raise UserError(f"--max-iterations must be in 1..20, got {max_iterations}")
    if not 0.0 <= min_gain <= 10.0:  # NaN fails both
        raise UserError(f"--min-gain must be in 0..10, got {min_gain}")
    spec = cfg.validate()
    more_rounds = second_job_rounds(rounds, more_rounds)
    check_loop_args(cfg, rounds, profile_steps, after, time_limit_s, baseline)
    if not 0 <= more_rounds <= MAX_ROUNDS:
        raise UserError(f"--more-rounds must be in 0..{MAX_ROUNDS}, got {more_rounds:,}")
    work = Path(work)
    if work.exists() and not work.is_dir():
        raise UserError(f"--work {work}: not a directory")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--work {work}: cannot create it ({e.strerror or e})") from None
    common = [
        "--workload",
        cfg.workload,
        *(["--max-rows", str(cfg.max_rows)] if cfg.max_rows else []),
    ]
    if baseline is None:
        baseline = str(work / "torchrec.plan.json")
        _step(
            "plan from-torchrec",
            ["plan", "from-torchrec", *common, "--world-size", str(cfg.nproc), "--out", baseline],
            run_command,
            echo,
        )
    result = TuneResult(baseline=baseline, candidate=baseline)
    plan, predicted = baseline, None
    train = [*common, "--nproc", str(cfg.nproc), "--seed", str(cfg.seed), "--device", cfg.device]
    if cfg.batch_size:
        train += ["--batch-size", str(cfg.batch_size)]
    profiled: list[str] = []  # every profile so far, each base one before its sparse-dist twin
    for i in range(max_iterations + 1):
        # all side by side in one job: their steps are timed at the same job's speed
        prof, prof_sd = str(work / f"profile{i}"), str(work / f"profile{i}-sparse-dist")
        runs = [(p, f"{prof}{suffix}") for p, suffix in calibration_plans(plan, work, baseline)]
        argv = [
            "profile",
            *train,
            "--plan",
            runs[0][0],
            "--out",
            runs[0][1],
            *(x for run_plan, d in runs[1:] for x in ("--also", run_plan, d)),
            "--steps",
            str(profile_steps),
            "--steady-steps",
            str(max(after, STEADY_STEPS)),
            "--force",
        ]
        _step(f"profile {plan}", argv, run_command, echo)
        crowded = shared_cores([runs[0][1]]) if i == 0 else None
        if crowded:
            echo(f"tune: {crowded}")
        profiled[:0] = [d for _, d in runs]  # this plan's first: the sparse-dist fit pairs it
        _step(f"analyze {prof}", ["analyze", *profiled], run_command, echo)
        nxt = str(work / f"plan{i + 1}.json")
        planned = _step(
            f"optimize --profile {prof}",
            [
                "optimize",
                *(x for d in profiled for x in ("--profile", d)),
                "--time-limit",
                str(time_limit_s),
                "--min-gain",
                str(min_gain),
                "--split-margin",
                str(min_gain),
                "--out",
                nxt,
            ],
            run_command,
            echo,
        )
        own = (
            prof_sd if json.loads(Path(plan).read_text()).get("pipeline") == "sparse-dist" else prof
        )
        measured = models_step_s(own, *([f"{prof}-model-2"] if own == prof else []))
        base_step = models_step_s(*([prof, f"{prof}-model-2"] if i == 0 else [f"{prof}-baseline"]))
        held = json.loads(Path(prof, "calibration.json").read_text()).get("held_out", [])
        there = result.iterations[-1].baseline_step_s if result.iterations else None
        levelled = None if there is None else measured * there / base_step
        costs = median_step_costs(read_manifest(own))
        result.iterations.append(
            Iteration(plan, own, predicted, measured, nxt, base_step, held, levelled, costs)
        )
        pred = "—" if predicted is None else f"{predicted * 1e3:.2f} ms"
        loo = ", ".join(
            f"{Path(h['profile']).name} {h['error']:+.1%}"
            + (f" ({unmeasured_note(u)})" if (u := h.get("unmeasured")) else "")
            for h in held
        )
        beside = (
            ""
            if there is None or levelled is None
            else f", {levelled * 1e3:.2f} ms at the speed of the job it was predicted from (the "
            f"baseline {base_step * 1e3:.2f} ms beside it, {there * 1e3:.2f} ms there)"
        )
        echo(
            f"tune: iteration {i}: {Path(plan).name} predicted {pred}, measured "
            f"{measured * 1e3:.2f} ms (steady steps){beside}"
            + (f"; leave-one-out errors of the joint calibration: {loo}" if loo else "")
            + (
                ""
                if costs is None
                else f"; its splits' batch transform {costs[0] * 1e3:.2f} ms a step "
                f"({costs[0] / measured:.1%} of it) and recombination {costs[1] * 1e3:.2f} ms"
            )
        )
        for line in dict.fromkeys(planned.splitlines()):  # the next plan's choices, and why
            if line.startswith(OPTIMIZER_VERDICTS):
                echo(f"tune: optimize: {' '.join(line.split())}")
        # the same plan again, or back to one already profiled (its profile is fitted on)
        earlier = next((it.plan for it in result.iterations if same_sharding(nxt, it.plan)), None)
        if earlier is not None:
            plan, result.fixed_point = earlier, True
            break
        if i == max_iterations:
            break
        plan, predicted = nxt, json.loads(Path(nxt).read_text())["predicted"]["step_time_s"]
    tried = [(it.plan, it.measured_step_s, it.baseline_step_s) for it in result.iterations[1:]]
    result.candidate = fastest_beside_baseline(tried, plan)
    if result.candidate != plan:
        echo(
            f"tune: {Path(result.candidate).name} ran faster beside the baseline than "
            f"{Path(plan).name}, where the loop ended: it is the candidate"
        )
    if same_sharding(result.candidate, baseline):
        result.shipped, result.reason = "baseline", "SparseLift's plan is the baseline's: kept it"
    else:
        base = dataclasses.replace(cfg, hook=ab_hook, hook_args=ab_hook_args or {})
        ab = run_ab(base, work, result.candidate, result.baseline, rounds, echo, more_rounds)
        result.ab_ratios, result.shipped, result.reason = ab.ratios, ab.shipped, ab.reason
        result.ratio, result.low, result.high = ab.ratio, ab.low, ab.high
        result.confidence, result.ab_jobs = ab.confidence, ab.jobs
    shipped = result.candidate if result.shipped == "candidate" else result.baseline
    write_json(work / "tune.json", result.to_json())
    write_bytes(out, Path(shipped).read_bytes())
    echo(f"tune: {result.reason}; wrote {out} ({spec.name}, {cfg.nproc} ranks)")
    return result


def check_loop_args(
    cfg: TrainConfig,
    rounds: int,
    profile_steps: int,
    after: int,
    time_limit_s: float,
    baseline: str | None,
) -> None:
    """Refuse up front what a step of the loop would refuse only after others ran (and in two
    lines: the step's and the loop's): the A/B's rounds, the profiles' steps, optimize's time
    limit, and a baseline plan that is unreadable or does not fit `cfg`'s workload and ranks.

    Raises:
        UserError: one line naming the flag (or the plan file and what does not fit).
    """
    if not 1 <= rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be in 1..{MAX_ROUNDS}, got {rounds:,}")
    if not 1 <= profile_steps <= MAX_STEPS:
        raise UserError(f"--profile-steps must be in 1..{MAX_STEPS:,}, got {profile_steps:,}")
    if not 0 <= after <= MAX_STEPS:
        raise UserError(f"--after must be in 0..{MAX_STEPS:,}, got {after:,}")
    if not (math.isfinite(time_limit_s) and time_limit_s > 0):
        raise UserError(f"--time-limit must be a finite number > 0, got {time_limit_s}")
    if baseline is not None:
        dataclasses.replace(cfg, plan=baseline).validate()


def _step(what: str, argv: list[str], run: Command, echo: Callable[[str], None]) -> str:
    """Run one `sparselift` command in-process; raise if it failed.

    Returns:
        What it printed (kept out of tune's own output).
    """
    echo(f"tune: sparselift {' '.join(argv)}")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run(argv)
    if code != 0:
        raise StepFailed(what, code)
    return printed.getvalue()
