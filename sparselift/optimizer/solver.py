"""Build → solve → read out: one CP-SAT solve of a `Problem`, and the choice between formulations.

`mode="exact"` solves `formulation.build_exact` (optimal for the model; a time-limited solve is
then polished by `placement.improve_placement`). `mode="decomposed"` solves
`formulation.build_aggregate` for the classes, then places the shards (`placement.place_greedy`,
then `improve_placement`): the plan's cost is its true cost, its gap against the relaxation's
bound honest. `mode="auto"` runs the decomposed formulation (a plan, fast) and then, where the
exact model is small enough, the exact one warm-started from the better of that plan and the
caller's, keeping the better plan.

Determinism: a fixed `random_seed`, `num_workers` (default 1) and a *deterministic* time limit
(`max_deterministic_time` = DET_SHARE × the limit), so the same inputs give the same plan; the
wall-clock limit is the user's and only stops a slow machine (the status then ends in
_WALL_LIMIT, and that solve may not repeat exactly).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from ortools.sat.python import cp_model

from sparselift.errors import UserError
from sparselift.optimizer.formulation import (
    CpModelVars,
    add_warm_start,
    build_aggregate,
    build_exact,
)
from sparselift.optimizer.placement import improve_placement, place_greedy
from sparselift.optimizer.problem import NS, Problem, Solution
from sparselift.optimizer.space import Choice, OptionClass, PlanWide

EXACT_MAX_PLACEMENTS = 5_000  # booleans of the exact model up to which `auto` also solves it
AUTO_DECOMPOSED_SHARE, AUTO_EXACT_SHARE = 0.3, 0.7  # of the time limit, `auto`'s two stages
# The deterministic limit is set to bind before the wall clock on a loaded machine, so that a
# time-limited solve still repeats exactly.
DET_SHARE = 0.25

WarmStart = Callable[[], Mapping[str, Choice] | None]


class Progress(cp_model.CpSolverSolutionCallback):
    """Prints each improving solution's step, the proven bound and the time while CP-SAT runs.

    Args:
        constant_s: seconds the objective leaves out (the dense step), added to what it prints.
        out: where lines go (None: count solutions only).
    """

    def __init__(self, constant_s: float, out: Callable[[str], None] | None) -> None:
        super().__init__()
        self.constant_s, self.out, self.n = constant_s, out, 0

    def on_solution_callback(self) -> None:
        """Called by CP-SAT at each improving solution."""
        self.n += 1
        if self.out:
            step = self.objective_value / NS + self.constant_s
            bound = self.best_objective_bound / NS + self.constant_s
            self.out(
                f"  solution {self.n}: step {step * 1e3:.3f} ms, bound {bound * 1e3:.3f} ms, "
                f"{self.wall_time:.1f} s"
            )


def solve(
    p: Problem,
    *,
    time_limit_s: float = 30.0,
    seed: int = 0,
    workers: int = 1,
    mode: str = "auto",
    progress: Callable[[str], None] | None = None,
    warm_start: WarmStart | None = None,
) -> Solution:
    """Choose every table's option and placement, and the pipeline, to minimize the step time.

    Args:
        p: the problem.
        time_limit_s: the solve's time limit (deterministic share DET_SHARE; see the module).
        seed: CP-SAT's random seed.
        workers: CP-SAT's workers (1: deterministic).
        mode: "auto", "exact" or "decomposed".
        progress: where solution lines go while CP-SAT runs.
        warm_start: called once, after the first model is built and before it is solved: the
            plan to start from (TorchRec's), or None. Late so that whatever makes it (a planner
            in child processes) runs while the model is built.
    Returns:
        The solution.
    Raises:
        UserError: no plan fits the memory, or none was found in the time limit.
    """
    hint_once = _Once(warm_start)

    def once(mode: str, limit_s: float, start: WarmStart) -> Solution:
        return solve_once(
            p,
            time_limit_s=limit_s,
            seed=seed,
            workers=workers,
            mode=mode,
            progress=progress,
            warm_start=start,
        )

    if mode != "auto":
        return once(mode, time_limit_s, hint_once)
    if p.count_placements() > EXACT_MAX_PLACEMENTS:
        return once("decomposed", time_limit_s, hint_once)
    try:
        first = once("decomposed", AUTO_DECOMPOSED_SHARE * time_limit_s, hint_once)
    except UserError:  # the decomposition's placement or memory margin found no room: exact may
        return once("exact", time_limit_s, hint_once)

    def with_pipeline(s: Solution) -> PlanWide:
        return PlanWide(p.plan_wide.forward, p.plan_wide.backward, s.pipeline)

    first_cost = p.model.evaluate(p.by_name, first.choices, with_pipeline(first)).step_time_s
    hint: Mapping[str, Choice] = first.choices
    given = hint_once()
    # a plan's choices hint the exact model where they are in its space (a plan whose splits are
    # not among those offered is not)
    if given is not None and all(ch.cls in p.classes.get(n, ()) for n, ch in given.items()):
        given_cost = p.model.evaluate(
            p.by_name, given, PlanWide(p.plan_wide.forward, p.plan_wide.backward)
        ).step_time_s
        if given_cost < first_cost:
            hint = given
    try:
        exact = once("exact", AUTO_EXACT_SHARE * time_limit_s, lambda: hint)
    except UserError:
        return first
    exact_cost = p.model.evaluate(p.by_name, exact.choices, with_pipeline(exact)).step_time_s
    return exact if exact_cost <= first_cost else first


def solve_once(
    p: Problem,
    *,
    time_limit_s: float,
    seed: int,
    workers: int,
    mode: str,
    progress: Callable[[str], None] | None = None,
    warm_start: WarmStart | None = None,
) -> Solution:
    """Build one formulation, add the warm start, solve deterministically, read the choices out.

    Args:
        p: the problem.
        time_limit_s, seed, workers, progress: as `solve`.
        mode: "exact" or "decomposed".
        warm_start: called once the model is built; its choices are the hint.
    Returns:
        The solution (a decomposed one's status is at best FEASIBLE: optimal for the
        relaxation, not for the placement).
    Raises:
        UserError: infeasible memory, no solution in the limit, a model too large for 64-bit
            integers, or no room to place a shard.
    """
    t0 = time.perf_counter()
    built = build_exact(p) if mode == "exact" else build_aggregate(p)
    t_wait = time.perf_counter()
    hint = warm_start() if warm_start is not None else None
    waited = time.perf_counter() - t_wait
    add_warm_start(p, built, hint)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.random_seed = seed
    prm.num_workers = workers
    prm.max_deterministic_time = DET_SHARE * float(time_limit_s)
    prm.max_time_in_seconds = float(time_limit_s)
    status = solver.solve(built.model, Progress(built.constant_s, progress))
    det_time_s = solver.deterministic_time
    if status == cp_model.UNKNOWN and built.decomposed:
        # On a large aggregate model presolve alone can spend the deterministic budget; solving
        # from the warm start without it still repeats exactly and finds a plan.
        prm.cp_model_presolve = False
        prm.max_time_in_seconds = max(1.0, float(time_limit_s) - solver.wall_time)
        status = solver.solve(built.model, Progress(built.constant_s, progress))
        det_time_s += solver.deterministic_time
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.INFEASIBLE:
            raise UserError("no plan fits the topology's memory with the available options")
        if status == cp_model.MODEL_INVALID:  # CP-SAT refuses sums that could overflow int64
            raise UserError(
                "the problem is too large for the solver's integer model (nanoseconds and bytes "
                "overflow 64 bits): plan for fewer ranks or a smaller batch"
            )
        raise UserError(
            f"the solver found no plan within {time_limit_s:g} s (status {name}); "
            "raise --time-limit"
        )
    pipeline = read_pipeline(built, solver)
    if mode == "exact":
        choices = read_exact(p, built, solver)
        if name != "OPTIMAL":
            choices = improve_placement(p, choices, pipeline)
    else:
        classes = {name: read_class(p, built, solver, name) for name in chosen(p, built, solver)}
        choices = improve_placement(p, place_greedy(p, classes), pipeline)
        name = "FEASIBLE" if name == "OPTIMAL" else name  # optimal for the relaxation only
    if solver.wall_time >= prm.max_time_in_seconds - 0.5:
        name += "_WALL_LIMIT"
    return Solution(
        choices=choices,
        pipeline=pipeline,
        status=name,
        objective_s=solver.objective_value / NS + built.constant_s,
        bound_s=solver.best_objective_bound / NS + built.constant_s,
        det_time_s=det_time_s,
        wall_s=time.perf_counter() - t0 - waited,
        mode=mode,
        seed=seed,
        workers=workers,
    )


# ----------------------------------------------------------------------------------- read-outs
def read_exact(p: Problem, built: CpModelVars, solver: cp_model.CpSolver) -> dict[str, Choice]:
    """Every table's choice (class and ranks or host) from a solved exact model (a split
    table's parts in its stead)."""
    out = {}
    for name in chosen(p, built, solver):
        c = read_class(p, built, solver, name)
        if c.located == "rank":
            ranks = tuple(
                r for r in range(p.topo.world_size) if solver.value(built.place[name, c, r])
            )
            out[name] = Choice(c, ranks=ranks)
        elif c.located == "host":
            out[name] = Choice(
                c,
                host=next(
                    h for h in range(p.topo.num_hosts) if solver.value(built.place[name, c, h])
                ),
            )
        else:
            out[name] = Choice(c)
    return out


def chosen(p: Problem, built: CpModelVars, solver: cp_model.CpSolver) -> list[str]:
    """The tables a solved model runs: each model table, or the parts of the split chosen."""
    return [
        s.name
        for s in p.tables
        if any(solver.value(built.use[s.name, c]) for c in p.classes[s.name])
    ]


def read_class(p: Problem, built: CpModelVars, solver: cp_model.CpSolver, name: str) -> OptionClass:
    """The class a solved model chose for table `name`."""
    return next(c for c in p.classes[name] if solver.value(built.use[name, c]))


def read_pipeline(built: CpModelVars, solver: cp_model.CpSolver) -> str:
    """The pipeline a solved model chose: "sparse-dist" or "base"."""
    return "sparse-dist" if solver.value(built.sparse_dist) else "base"


class _Once:
    """A warm start called at most once: every stage of `auto` sees the same answer."""

    def __init__(self, warm_start: WarmStart | None) -> None:
        self.warm_start, self.called = warm_start, False
        self.hint: Mapping[str, Choice] | None = None

    def __call__(self) -> Mapping[str, Choice] | None:
        if not self.called:
            self.hint = self.warm_start() if self.warm_start is not None else None
            self.called = True
        return self.hint
