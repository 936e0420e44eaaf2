"""Hooks the harness loads inside launched ranks in tests (`TrainConfig.hook = "rank_hooks:…"`)."""

from __future__ import annotations


class CrashOnRank:
    """Raise on one rank at one step, to check that a crash ends the whole job quickly."""

    def __init__(self, ctx, rank: int = 1, step: int = 1) -> None:
        self.ctx, self.rank, self.step = ctx, rank, step

    def step_begin(self, step: int) -> None:
        if self.ctx.rank == self.rank and step == self.step:
            raise RuntimeError(f"injected failure on rank {self.rank}")

    def step_end(self, step: int) -> None:
        pass

    def finish(self) -> dict:
        return {}


class ShardingTypes:
    """Report how each table was sharded on this rank, for assertions in the parent."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx

    def step_begin(self, step: int) -> None:
        pass

    def step_end(self, step: int) -> None:
        pass

    def finish(self) -> dict:
        out = {}
        for module_plan in self.ctx.model.plan.plan.values():
            for table, ps in module_plan.items():
                out[table] = {
                    "sharding_type": ps.sharding_type,
                    "compute_kernel": ps.compute_kernel,
                    "ranks": ps.ranks,
                }
        return {"tables": out, "device": str(self.ctx.device), "world_size": self.ctx.world_size}


class SlowPlan:
    """A test-only slowdown of the run whose plan file is named `plan_name`: rank 0 sleeps before
    every step, so the other ranks wait for it inside their timed step (the harness times a step
    without its hooks, and takes the slowest rank)."""

    def __init__(self, ctx, plan_name: str, delay_s: float = 0.05) -> None:
        from pathlib import Path

        named = ctx.plan_file is not None and Path(ctx.plan_file).name == plan_name
        self.slow = named and ctx.rank == 0
        self.delay_s = delay_s

    def step_begin(self, step: int) -> None:
        if self.slow:
            import time

            time.sleep(self.delay_s)

    def step_end(self, step: int) -> None:
        pass

    def finish(self) -> dict:
        return {}


DELAY_ENV = "SPARSELIFT_TEST_STEP_DELAY_S"  # seconds `DelayedProfile` adds to every step


def DelayedProfile(ctx, **profile_args):
    """The profiler's own hook (`sparselift.profiler.hook.make_hook`, with `sparselift profile`'s
    arguments) on a run whose every step is made DELAY_ENV seconds slower on every rank: a
    test-only, known per-step cost. The sleep is inside the pipeline's step, so inside both the
    harness's timed step and the profiled step; no event covers it (the main thread is idle).
    A test swaps it in for `sparselift.cli.profile.HOOK` and sets DELAY_ENV, which the launched
    ranks inherit."""
    import os
    import time

    from sparselift.profiler.hook import make_hook

    delay_s = float(os.environ.get(DELAY_ENV, "0"))
    pipeline = ctx.pipeline
    progress = pipeline.progress

    def slower(batches):
        time.sleep(delay_s)
        return progress(batches)

    pipeline.progress = slower  # the harness steps `ctx.pipeline`, this very object
    return make_hook(ctx, **profile_args)
