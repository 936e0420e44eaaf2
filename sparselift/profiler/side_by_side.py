"""Plans measured side by side in one job of a user's own trainer, for `sparselift compare`.

Separate jobs of one plan run up to 1.3–1.5× apart on a shared host, more than most plans
differ, so two profiles from two jobs carry little of a verdict. A trainer that can hold both
models at once (memory for each) runs them in one job instead: each contender is a callable
that runs one training step of its own model (drawing its own batch), and `side_by_side` runs
them in turns, in the same processes, seconds apart, as `sparselift bench` and `tune`'s A/B do
on the built-in harness (`workloads.side_by_side`). Each round gives every contender one turn,
the order rotated a place per round: one untimed step (it runs on the caches the previous
contender left), then `steps` timed ones. Every rank times each step (CUDA synchronized), and
rank 0 writes the slowest rank's time per step to `side_by_side.json`, which `sparselift
compare FILE` turns into a verdict paired round by round (`analysis.compare`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sparselift.atomic import check_writable, file_in_the_way, write_json
from sparselift.errors import UnwritablePathError
from sparselift.profiler.gather import gather_to_rank0

FORMAT, VERSION = "sparselift-side-by-side", 1
FILE = "side_by_side.json"


def side_by_side(
    out_dir: str | Path,
    contenders: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 8,
    steps: int = 20,
    warmup: int = 3,
    group: Any = None,
) -> Path | None:
    """Run `contenders`' training steps in turns and record their step times; every rank calls
    it, with the same names in the same order.

    Args:
        out_dir: where rank 0 writes `side_by_side.json` (created if missing).
        contenders: a name per plan (the first is the baseline `compare` reads by default) and a
            callable that runs one training step of that plan's model.
        rounds: turns of each contender; the verdict pairs them round by round.
        steps: timed steps a turn.
        warmup: untimed steps of each contender before the first round.
        group: the process group to gather the ranks' times over (None: the default group).
    Returns:
        The file written on rank 0; None on the other ranks.
    Raises:
        ValueError: fewer than 2 contenders, a name that is not a non-empty string, a contender
            that is not callable, rounds or steps below 1, or warmup below 0.
        ValueError (on every rank): the ranks differ in contenders' names or order, rounds,
            steps or warmup.
        UnwritablePathError (on every rank): `out_dir` cannot take the file (checked on rank 0
            before any step runs).
    """
    import torch

    from sparselift.workloads.side_by_side import turns  # the harness's order of turns

    names = list(contenders)
    if len(names) < 2 or not all(isinstance(n, str) and n for n in names):
        raise ValueError("side_by_side needs 2 or more contenders, each named by a string")
    if not all(callable(f) for f in contenders.values()):
        raise ValueError("side_by_side: each contender must be a callable running one step")
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError("side_by_side: rounds and steps must be >= 1 and warmup >= 0")
    out = Path(out_dir, FILE)
    _agree(out, (names, rounds, steps, warmup), group)
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()

    def timed(name: str) -> float:
        t0 = time.perf_counter()
        contenders[name]()
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for name in names:
        for _ in range(warmup):
            timed(name)
    mine: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        for i in turns(len(names), r):
            timed(names[i])  # the switch: runs on the previous contender's caches
            mine[names[i]].append([timed(names[i]) for _ in range(steps)])
    every = gather_to_rank0(mine, group)
    if every is None:
        return None
    slowest = {n: _slowest([m[n] for m in every]) for n in names}
    write_json(
        out,
        {
            "format": FORMAT,
            "version": VERSION,
            "world_size": len(every),
            "contenders": names,
            "steps": steps,
            "warmup": warmup,
            "step_s": slowest,
        },
    )
    return out


def _slowest(per_rank: list[list[list[float]]]) -> list[list[float]]:
    """The slowest rank's time of each step of each turn (every rank ran the same turns)."""
    return [[max(step) for step in zip(*turn, strict=True)] for turn in zip(*per_rank, strict=True)]


def _agree(out: Path, run: tuple[Any, ...], group: Any) -> None:
    """Before any step: rank 0 creates `out`'s folder and checks it can take `out`, and every
    rank must run the same `run` (names, rounds, steps, warmup). Raises on every rank where
    either fails, so no rank is left waiting in a step's collectives for one that stopped, and
    no rank's turn runs another contender's model.

    Raises:
        UnwritablePathError: rank 0 cannot write `out`.
        ValueError: a rank's `run` differs from rank 0's (naming the rank).
    """
    import torch.distributed as dist

    rank = dist.get_rank(group) if dist.is_initialized() else 0
    why: str | None = None
    if rank == 0:
        try:
            if file_in_the_way(out) is None:  # else check_writable names the file
                out.parent.mkdir(parents=True, exist_ok=True)
            check_writable(out)
        except UnwritablePathError as e:
            why = str(e)
        except OSError as e:
            why = f"cannot write {out}: {e.strerror or e}"
    every: list[Any] = [(why, run)]
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        every = [None] * dist.get_world_size(group)
        dist.all_gather_object(every, (why, run), group=group)
    if every[0][0] is not None:
        raise UnwritablePathError(every[0][0])
    for r, (_, theirs) in enumerate(every):
        if theirs != every[0][1]:
            raise ValueError(
                f"side_by_side: rank {r} runs {theirs}, rank 0 {every[0][1]} (contenders, "
                "rounds, steps, warmup): every rank must give the same, names in the same order"
            )
