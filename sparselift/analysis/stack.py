"""One rank's main (Python) thread: its steps, each event's place on the call stack, self time.

Each main-thread event gets the sparse stage of its call stack (the outermost TorchRec annotation
wins; backward ops inherit their forward op's stage through the autograd sequence number), its
phase (forward, backward or other), module and sharding type; the thread's time is then cut into
self-time segments, each instant belonging to the innermost event running there.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from sparselift.analysis import names
from sparselift.analysis.trace import dims_of

# (stage, phase, module, sharding) of a call-stack frame
_Context = tuple[str | None, str, str | None, str | None]


class MainThread(NamedTuple):
    """The thread that carries the ProfilerStep#N annotations."""

    pid: str
    tid: str


def main_thread(events: pd.DataFrame) -> MainThread:
    """The (pid, tid) with the most ProfilerStep#N events.

    Raises:
        ValueError: the trace has no ProfilerStep#N event (the profile checks catch it earlier).
    """
    steps = events[events["name"].str.match(names.STEP.pattern)]
    if steps.empty:
        raise ValueError("no ProfilerStep#N events")
    pid, tid = steps[["pid", "tid"]].value_counts().index[0]
    return MainThread(pid, tid)


def step_windows(events: pd.DataFrame, thread: MainThread) -> pd.DataFrame:
    """Measured steps of `thread`: step, start_us, end_us, dur_s, in start order."""
    on_thread = (events["pid"] == thread.pid) & (events["tid"] == thread.tid)
    s = events[on_thread & events["name"].str.match(names.STEP.pattern)]
    out = pd.DataFrame(
        {
            "step": s["name"].str.extract(names.STEP.pattern)[0].astype(int).values,
            "start_us": s["ts"].values,
            "end_us": s["end"].values,
        }
    )
    out["dur_s"] = (out["end_us"] - out["start_us"]) * 1e-6
    return out.sort_values("start_us").reset_index(drop=True)


def annotate_stack(main: pd.DataFrame) -> pd.DataFrame:
    """Per main-thread event: stage, phase, module, sharding and depth from its call stack.

    Args:
        main: the main thread's events, sorted by start (then longest first).
    Returns:
        A copy of `main` with those five columns added.
    """
    stage: list[str | None] = []
    phase: list[str] = []
    module: list[str | None] = []
    sharding: list[str | None] = []
    depth: list[int] = []
    fwd_ctx: dict[int, tuple[Any, ...]] = {}  # autograd sequence number → forward context
    stack: list[tuple[float, _Context]] = []
    seen: dict[str, _NameFacts] = {}
    for name, ts, end, seq in zip(main["name"], main["ts"], main["end"], main["seq"], strict=True):
        facts = seen.get(name)
        if facts is None:
            facts = seen[name] = _name_facts(name)
        is_bwd, is_fwd, own_stage, permute, tagged, tbe_node = facts
        while stack and stack[-1][0] <= ts:
            stack.pop()
        p_stage, p_phase, p_mod, p_sh = stack[-1][1] if stack else (None, "other", None, None)
        ph = p_phase
        if ph != "bwd" and is_bwd:
            ph = "bwd"
        elif ph == "other" and (is_fwd or own_stage):
            ph = "fwd"
        st, mod, sh = p_stage, p_mod, p_sh
        if st is None:
            st = own_stage
            if st is None and ph == "fwd" and permute:
                st = "input_dist"
            ctx = _forward_of(fwd_ctx, seq, tbe_node) if ph == "bwd" else None
            if ctx is not None:
                st, mod, sh = ctx if st is None or mod is None else (st, *ctx[1:])
        if tagged is not None and mod is None:
            mod, sh = tagged
        if ph == "fwd" and st is not None and seq is not pd.NA and seq is not None:
            fwd_ctx[int(seq)] = (st, mod, sh)  # the last: the op that made the node
        stage.append(st)
        phase.append(ph)
        module.append(mod)
        sharding.append(sh)
        depth.append(len(stack))
        stack.append((end, (st, ph, mod, sh)))
    out = main.copy()
    out["stage"] = stage
    out["phase"] = phase
    out["module"] = module
    out["sharding"] = sharding
    out["depth"] = depth
    return out


class _NameFacts(NamedTuple):
    """What an event's name alone says (`annotate_stack` reads it once per distinct name)."""

    backward: bool
    forward_block: bool
    stage: str | None
    input_permute: bool
    tagged: tuple[Any, Any] | None  # (module, sharding) of a tagged annotation
    tbe_node: bool  # a TBE's autograd node (`names.TBE_BWD_NODE`)


def _name_facts(name: str) -> _NameFacts:
    m = names.TAGGED.match(name)
    return _NameFacts(
        bool(names.BACKWARD.search(name)),
        bool(names.FORWARD_BLOCK.search(name)),
        names.stage_of(name),
        bool(names.INPUT_PERMUTE.search(name)),
        (m.group("module"), m.group("sharding")) if m else None,
        bool(names.TBE_BWD_NODE.search(name)),
    )


def _forward_of(
    fwd_ctx: dict[int, tuple[Any, ...]], seq: Any, tbe_node: bool
) -> tuple[Any, ...] | None:
    """The forward context a backward event with autograd sequence number `seq` belongs to.

    The op that made the node, by its number; for a TBE's autograd node whose number no forward
    op carries, the lookup op numbered one below it. The dense TBE's forward op (data-parallel
    tables) is recorded with the number before its node's, and its backward would otherwise be
    left to no sharding type. None where nothing matches.
    """
    if seq is pd.NA or seq is None:
        return None
    ctx = fwd_ctx.get(int(seq))
    if ctx is None and tbe_node:
        ctx = fwd_ctx.get(int(seq) - 1)
        if ctx is not None and ctx[0] != "lookup":
            ctx = None
    return ctx


def self_segments(main: pd.DataFrame, t0: float, t1: float) -> pd.DataFrame:
    """Disjoint [start, end) pieces of [t0, t1), each owned by its innermost event.

    Args:
        main: the main thread's events (`ts`, `end`), sorted by start.
        t0, t1: the window, in trace microseconds.
    Returns:
        start, end, event (the owning event's index in `main`; -1: no event, the thread idles).
    """
    seg_s: list[float] = []
    seg_e: list[float] = []
    seg_i: list[int] = []
    stack: list[tuple[float, int]] = []
    cur = t0

    def emit(a: float, b: float, i: int) -> None:
        if b > a:
            seg_s.append(a)
            seg_e.append(b)
            seg_i.append(i)

    # the window's events from the columns' arrays: a step reads its own events, not a copy of
    # every column of them
    starts, ends = main["ts"].to_numpy(dtype=np.float64), main["end"].to_numpy(dtype=np.float64)
    sel = np.flatnonzero((starts < t1) & (ends > t0))
    idx = main.index.to_numpy()[sel].tolist()
    clipped = np.maximum(starts[sel], t0).tolist(), np.minimum(ends[sel], t1).tolist()
    for i, ts, end in zip(idx, *clipped, strict=True):
        while stack and stack[-1][0] <= ts:
            e, j = stack.pop()
            emit(cur, e, j)
            cur = max(cur, e)
        emit(cur, ts, stack[-1][1] if stack else -1)
        cur = max(cur, ts)
        end = min(end, stack[-1][0]) if stack else end  # children never outlive parents
        stack.append((end, i))
    while stack:
        e, j = stack.pop()
        emit(cur, e, j)
        cur = max(cur, e)
    emit(cur, t1, -1)
    return pd.DataFrame({"start": seg_s, "end": seg_e, "event": seg_i})


def lookup_ids(main: pd.DataFrame) -> pd.Series:
    """Ids looked up per TBE forward call, from the recorded shapes.

    bounds_check_indices' indices where recorded, else the TBE op's (indices [N] then offsets
    [B·T+1]); the dense TBE's (data-parallel tables, which no bounds check precedes) always,
    from its indices argument; 0 for every other event.
    """
    ids = pd.Series(0, index=main.index, dtype="int64")
    checked = False
    for i, name, dims in zip(main.index, main["name"], main["input_dims"], strict=True):
        if names.BOUNDS_CHECK.search(name):
            d = dims_of(dims)
            if len(d) > 1 and isinstance(d[1], list) and len(d[1]) == 1:
                ids[i] = d[1][0]
                checked = True
        elif names.DENSE_TBE_FWD.search(name):
            d = dims_of(dims)  # (dev_weights, ..., indices [N], offsets [B·T+1], ...)
            if len(d) > 8 and _is_1d(d[7]) and _is_1d(d[8]) and d[8][0] > 1:
                ids[i] = d[7][0]
    if checked:
        return ids
    for i, name, dims in zip(main.index, main["name"], main["input_dims"], strict=True):
        if names.TBE_FWD.search(name):
            d = dims_of(dims)
            for a, b in zip(d, d[1:], strict=False):
                if _is_1d(a) and _is_1d(b) and b[0] % 2 == 1 and b[0] > 1 and a[0] >= b[0] - 1:
                    ids[i] = a[0]
                    break
    return ids


def _is_1d(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 1 and isinstance(x[0], int)
