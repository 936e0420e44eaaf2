"""The embedding kernels' own seconds per step, in the window and in the steady steps after it.

The profiled window does not slow every part of a step alike: the profiler's cost falls on the
ops around the kernels (many small ops, fresh buffers), while one FBGEMM lookup call runs about
as long with the profiler as without it. A calibration that divides every duration by the
step's inflation (window ÷ steady) then prices the lookups too low and the rest too high. So the
session also times this rank's table-batched lookups with two clock reads a call, in the window
and in the steady steps: the forward around each kernel module's forward, the backward (with the
fused optimizer) around its autograd node, so that the analysis scales the traced lookups by
what they measured here (`analysis.evidence`) instead of by the whole step's inflation.

On CUDA the kernels run asynchronously to these clock reads, so nothing is timed there (the
trace's kernel durations are the device's own).
"""

from __future__ import annotations

import time
from typing import Any

from torch import nn


def kernel_modules(sharded: list[tuple[str, Any]]) -> list[nn.Module]:
    """The table-batched kernel modules (FBGEMM's) of the sharded modules' lookups.

    Args:
        sharded: (name, module) of each sharded embedding module (`access.find_sharded_modules`).
    Returns:
        Each lookup group's kernel module, in the modules' order.
    """
    out = []
    for _, m in sharded:
        for lookup in getattr(m, "_lookups", []) or []:
            inner = getattr(lookup, "module", lookup)  # a data-parallel lookup is DDP-wrapped
            for emb in getattr(inner, "_emb_modules", []) or []:
                kernel = getattr(emb, "_emb_module", None)
                if isinstance(kernel, nn.Module):
                    out.append(kernel)
    return out


class LookupTimer:
    """Sums the kernels' forward and backward seconds of each step begun with `begin`.

    Args:
        kernels: the kernel modules (`kernel_modules`).
    """

    def __init__(self, kernels: list[nn.Module]) -> None:
        self.kernels = kernels
        self._handles: list[Any] = []
        self._fwd = self._bwd = 0.0
        self._started: dict[int, float] = {}

    @property
    def attached(self) -> bool:
        """Whether the hooks are in place."""
        return bool(self._handles)

    def attach(self) -> None:
        """Put the hooks on every kernel module (idempotent)."""
        if self._handles:
            return
        for k in self.kernels:
            self._handles.append(k.register_forward_pre_hook(self._pre))
            self._handles.append(k.register_forward_hook(self._post))

    def detach(self) -> None:
        """Remove the hooks (idempotent); a step's backward hooks go with its graph."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def begin(self) -> None:
        """A step starts: its sums start at 0."""
        self._fwd = self._bwd = 0.0

    def end(self) -> list[float]:
        """The step begun last has ended: its [forward, backward] seconds."""
        return [self._fwd, self._bwd]

    def _pre(self, module: nn.Module, inputs: Any) -> None:
        self._started[id(module)] = time.perf_counter()

    def _post(self, module: nn.Module, inputs: Any, output: Any) -> None:
        t0 = self._started.pop(id(module), None)
        if t0 is None:
            return
        self._fwd += time.perf_counter() - t0
        node = getattr(output, "grad_fn", None)
        if node is None:
            return
        began: list[float] = []
        node.register_prehook(lambda grads: began.append(time.perf_counter()))
        node.register_hook(lambda grads_in, grads_out: self._add_bwd(began))

    def _add_bwd(self, began: list[float]) -> None:
        if began:
            self._bwd += time.perf_counter() - began[0]


def lookup_record(per_rank: list[dict[str, list[list[float]]] | None]) -> list[Any] | None:
    """The manifest's `lookup_s`: per rank its {window, steady} lists of [forward, backward]
    seconds per step; None where no rank timed anything."""
    if not any(r and (r.get("window") or r.get("steady")) for r in per_rank):
        return None
    return [r or {"window": [], "steady": []} for r in per_rank]
