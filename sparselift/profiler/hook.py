"""The harness adapter: `TrainConfig.hook = "sparselift.profiler.hook:make_hook"`.

Each rank gets a `ProfileSession` that writes its own trace; rank 0's `finish()` carries the merged
access-statistics rows and manifest facts back to the parent (RankResult.extra), which writes
access_stats.parquet and manifest.json — so ranks never import pandas.
"""

from __future__ import annotations

from typing import Any

from sparselift.profiler.session import ProfileSession


def make_hook(
    ctx: Any,
    *,
    out_dir: str | list[str | None],
    warmup: int,
    steps: int,
    execution_trace: bool = False,
    command: list[str] | None = None,
    steady_steps: int = 10,
) -> ProfileSession | None:
    """The ProfileSession of one rank of a harness run (`ctx`: the harness's RankContext).

    It writes only its trace; the parent writes the directory's other files from rank 0's
    `finish()`. The run should train `steady_steps` steps after the window (`sparselift profile`
    does); a run that ends earlier records the steady steps it had.

    Args:
        out_dir: the profile directory; in a side-by-side job, a list with one entry per
            contender (`ctx.contender` picks it), None for a contender that is not profiled.
    Returns:
        The session, or None: this contender is not profiled.
    """
    out = out_dir[ctx.contender] if isinstance(out_dir, list) else out_dir
    if out is None:
        return None
    return ProfileSession(
        out,
        ctx.model,
        warmup=warmup,
        steps=steps,
        execution_trace=execution_trace,
        pipeline=ctx.pipeline,
        write_files=False,
        command=command,
        spec_tables={t.name: t for t in ctx.spec.tables},
        workload=ctx.spec.name,
        device=ctx.device,
        steady_steps=steady_steps,
        plan=ctx.plan,
    )
