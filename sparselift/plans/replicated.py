"""Data-parallel virtual tables trained with their table's fused row-wise Adagrad.

TorchRec replicates a data_parallel table with the dense kernel and leaves it to DDP and the
trainer's dense optimizer (e.g. torch's Adagrad over the averaged gradient). A model-parallel
table gets the same averaged gradient (TorchRec divides it by the world size in the backward
collectives, `comm_ops.get_gradient_division()`, on by default) but FBGEMM's fused row-wise
Adagrad in backward. For a hot part to train like the table it came from, SparseLift keeps
TorchRec's data_parallel sharding (its replication, state dict and input path) and replaces the
DDP gradient hook of those tables: their gradient is all-reduced as TorchRec's model-parallel
tables get it (the mean, or the sum with gradient division off) and the row-wise Adagrad step of
FBGEMM's EXACT_ROWWISE_ADAGRAD is applied to every replica right after the all-reduce, still
inside backward (other data-parallel tables keep DDP's average). The hot weights are marked as
optimized in backward, so the trainer's dense optimizer skips them, and their momentum is an
optimizer of its own in the model's `fused_optimizer` (checkpointed as TorchRec names it,
"<table>.momentum1").

A row untouched by a step has a zero gradient, which leaves its momentum and weight unchanged,
exactly as FBGEMM's sparse update leaves rows outside the batch. The result equals FBGEMM's up to
float rounding: a row's gradient is summed per rank and then across ranks, not in one pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizer

FBGEMM_EPS = 1e-8  # FBGEMM's default eps, which TorchRec's fused kernels use unless told
FBGEMM_LR = 0.01  # … and its default learning rate
ROWWISE_ADAGRAD = ("EXACT_ROWWISE_ADAGRAD", "ROWWISE_ADAGRAD")  # FBGEMM's EmbOptimType names


def rowwise_adagrad_args(weight: Any) -> tuple[dict[str, float] | None, str | None]:
    """The learning rate and eps of the row-wise Adagrad `weight` trains with in backward.

    Args:
        weight: an unsharded table weight after `apply_optimizer_in_backward`.
    Returns:
        ({"lr", "eps"}, None), or (None, why not) when it has no in-backward optimizer, another
        one than row-wise Adagrad, or weight decay.
    """
    from torchrec.distributed.utils import optimizer_type_to_emb_opt_type

    classes = getattr(weight, "_optimizer_classes", None)
    if not classes:
        return None, "it has no in-backward optimizer (apply_optimizer_in_backward)"
    kwargs = dict((getattr(weight, "_optimizer_kwargs", None) or [{}])[0])
    kind = kwargs.get("optimizer")
    if kind is None:
        try:
            kind = optimizer_type_to_emb_opt_type(classes[0])
        except ValueError:
            kind = None
    if getattr(kind, "name", kind) not in ROWWISE_ADAGRAD:
        return None, f"it trains with {getattr(classes[0], '__name__', classes[0])}"
    if kwargs.get("weight_decay"):
        return None, "its row-wise Adagrad has weight decay"
    lr = float(kwargs.get("lr", kwargs.get("learning_rate", FBGEMM_LR)) or FBGEMM_LR)
    # the fused kernels hold the learning rate in float32
    lr32 = float(torch.tensor(lr, dtype=torch.float32))
    return {"lr": lr32, "eps": float(kwargs.get("eps", FBGEMM_EPS))}, None


@dataclass
class _Span:
    """One replicated virtual table inside a data-parallel kernel's flat weight."""

    name: str  # the virtual table
    fqn: str  # its weight's name in the model
    weight: torch.Tensor  # the table's slice parameter (rows × dim view of the flat weight)
    data: torch.Tensor  # the same rows × dim, a plain view of the flat weight's data
    start: int  # elements into the flat weight
    end: int
    momentum: torch.Tensor  # row-wise Adagrad's sum of mean squared gradients, one per row
    group: dict[str, Any]  # its param group: "lr", "eps"


class ReplicatedRowWiseAdagrad(KeyedOptimizer):
    """The momentum of the replicated tables, applied in backward by the DDP hook (`step` does
    nothing, like TorchRec's fused optimizers). Its param groups' "lr" is read every step."""

    def __init__(self, spans: list[_Span]) -> None:
        """An optimizer over `spans`' weights; state "<table>.momentum1" per weight."""
        params = {s.fqn: s.weight for s in spans}
        state = {s.weight: {f"{s.name}.momentum1": s.momentum} for s in spans}
        super().__init__(params, state, [s.group for s in spans])
        self.spans = spans

    def step(self, closure: Any = None) -> None:  # noqa: D102 - applied in backward
        pass

    def zero_grad(self, set_to_none: bool = False) -> None:  # noqa: D102 - the hook zeroes
        pass


class _HookState:
    """What the DDP hook needs: the replicated spans of each flat weight, the group."""

    def __init__(self, spans: list[_Span], flat: dict[int, list[_Span]], pg: Any) -> None:
        self.spans, self.flat, self.pg = spans, flat, pg
        self.world = dist.get_world_size(pg)


def _hook(state: _HookState, bucket: Any) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: all-reduce the bucket, averaged as DDP does (the replicated spans as
    TorchRec's model-parallel tables: averaged unless gradient division is off), then take the
    replicated spans' row-wise Adagrad step."""
    from torchrec.distributed.comm_ops import get_gradient_division

    divide_replicated = get_gradient_division()
    buf = bucket.buffer()
    at = 0
    fused: list[tuple[_Span, torch.Tensor]] = []
    for p in bucket.parameters():
        n = p.numel()
        spans = sorted(state.flat.get(id(p), []), key=lambda s: s.start)
        done = 0
        for s in spans:
            buf[at + done : at + s.start].div_(state.world)  # DDP's average between spans
            grad = buf[at + s.start : at + s.end]
            if divide_replicated:
                grad.div_(state.world)
            fused.append((s, grad))
            done = s.end
        buf[at + done : at + n].div_(state.world)
        at += n
    fut = dist.all_reduce(buf, group=state.pg, async_op=True).get_future()

    def step(f: torch.futures.Future[Any]) -> torch.Tensor:
        out = f.value()[0]
        with torch.no_grad():
            for s, grad in fused:
                _rowwise_adagrad(s, grad.view_as(s.weight))
                grad.zero_()  # the step is taken; the dense optimizer never sees it
        return out

    return fut.then(step)


# DDP checks a hook's annotations as objects; this module's are strings (postponed evaluation)
_hook.__annotations__ = {
    "state": _HookState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def _rowwise_adagrad(s: _Span, grad: torch.Tensor) -> None:
    """FBGEMM's EXACT_ROWWISE_ADAGRAD on every row (zero-gradient rows do not move)."""
    g = grad.double()
    momentum = s.momentum.double() + (g * g).sum(1) / g.shape[1]
    s.momentum.copy_(momentum)
    multiplier = s.group["lr"] / (momentum.sqrt() + s.group["eps"])
    s.data.copy_(s.data.double() - g * multiplier[:, None])


def install(dmp: Any, replicated: dict[str, dict[str, float]], pg: Any) -> KeyedOptimizer | None:
    """Train the data-parallel virtual tables `replicated` ({table: rowwise_adagrad_args}) of
    DistributedModelParallel `dmp` with their row-wise Adagrad (see the module docstring).

    Call before the first step. Returns the optimizer added to `dmp.fused_optimizer`, or None
    when there is no such table.
    """
    if not replicated:
        return None
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingSharding

    names = {id(p): n for n, p in dmp.named_parameters()}
    spans: list[_Span] = []
    for _, m in dmp.named_modules():
        if not isinstance(m, ShardedEmbeddingBagCollection):
            continue
        mine = [t for t in replicated if t in m.embedding_bags]
        if not mine:
            continue
        flat: dict[int, list[_Span]] = {}
        for t in mine:
            w = m.embedding_bags[t].weight
            rows, dim = w.shape
            s = _Span(
                name=t,
                fqn=names[id(w)],
                weight=w,
                data=w._original_tensor.data[w._start_offset : w._end_offset].view(rows, dim),
                start=int(w._start_offset),
                end=int(w._end_offset),
                momentum=torch.zeros(rows, dtype=torch.float32, device=w.device),
                group={"params": [w], **replicated[t]},
            )
            flat.setdefault(id(w._original_tensor), []).append(s)
            spans.append(s)
        hook_state = _HookState(spans, flat, pg)
        for sharding, lookup in zip(m._embedding_shardings, m._lookups, strict=True):
            if isinstance(sharding, DpPooledEmbeddingSharding):
                lookup.register_comm_hook(hook_state, _hook)
    optimizer = ReplicatedRowWiseAdagrad(spans)
    for s in spans:  # optimized in backward: the trainer's dense optimizer leaves them alone
        s.weight._in_backward_optimizers = [optimizer]  # type: ignore[attr-defined]
    dmp._optim = CombinedOptimizer([*dmp.fused_optimizer.optimizers, ("", optimizer)])
    return optimizer


def replicated_tables(plan: Any, model: nn.Module) -> dict[str, dict[str, float]]:
    """The data-parallel parts of `plan`'s splits with their table's row-wise Adagrad args,
    read from the rewritten, unsharded `model` (whose virtual weights carry them)."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    parts = {p for s in plan.splits for p in s.parts}
    dp = {t.name for t in plan.tables if t.sharding_type == "data_parallel" and t.name in parts}
    out = {}
    for m in model.modules():
        if isinstance(m, EmbeddingBagCollection):
            for c in m.embedding_bag_configs():
                if c.name in dp:
                    args, _ = rowwise_adagrad_args(m.embedding_bags[c.name].weight)
                    if args is not None:
                        out[c.name] = args
    return out
