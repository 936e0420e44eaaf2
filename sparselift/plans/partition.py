"""The two-part stable partition of a routed group's ids, for `transform.BatchTransform`.

A hot/cold split and a row-range split in two parts route each id to one of two parts (a group
that holds a split in more parts goes through FBGEMM's bucketize: `routing.bucketed`). Their
ids are partitioned without a division per id: an id of part 0 goes after the
part-0 ids before it, an id of part 1 after every part-0 id and the part-1 ids before it. One
cumulative sum gives both positions and one scatter places each id, straight into the
transform's output where the group's stream is one block of it. Each bag's part-1 count is the
sum's rise across the bag, so no per-part pass over the ids is needed.
"""

from __future__ import annotations

import dataclasses

import torch

from sparselift.plans import routing
from sparselift.plans.routing import Stream


@dataclasses.dataclass
class Partition:
    """A group's ids split in two parts, not yet placed.

    The stream they make (`Stream`): part 0 then part 1, each feature after feature, bags in
    order. Member p * n_features + k is part p of the group's feature k.

    Attributes:
        ids: the ids to place, in input order (the output's dtype).
        weights: their weights, or None.
        pos: int64, each id's index in the stream.
        counts: ids per bag, member after member (the input's lengths dtype).
        prefix: each member's first index in the stream, then the stream's length.
        shift: per member, subtracted from its ids once placed (a row range's first row).
    """

    ids: torch.Tensor
    weights: torch.Tensor | None
    pos: torch.Tensor
    counts: torch.Tensor
    prefix: list[int]
    shift: list[int]
    _stream: Stream | None = None

    def whole(self, a: int, b: int) -> bool:
        """Whether members [a, b) are the whole stream."""
        return (a, b) == (0, len(self.prefix) - 1)

    def stream(self) -> Stream:
        """The stream, placed in a buffer of its own (once)."""
        if self._stream is None:
            v = torch.empty_like(self.ids)
            w = None if self.weights is None else torch.empty_like(self.weights)
            self.place(v, w)
            self._stream = Stream(v, w, self.counts, self.prefix)
        return self._stream

    def place(self, out_v: torch.Tensor, out_w: torch.Tensor | None) -> None:
        """Scatter the stream into `out_v` (and its weights into `out_w`), of its length."""
        out_v.scatter_(0, self.pos, self.ids)
        if out_w is not None and self.weights is not None:
            out_w.scatter_(0, self.pos, self.weights)
        for m, s in enumerate(self.shift):
            if s:
                out_v[self.prefix[m] : self.prefix[m + 1]].sub_(s)


def partition(
    part: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor | None,
    lens: torch.Tensor,
    n_features: int,
    stride: int,
    shift: list[int],
) -> Partition:
    """The `Partition` of `ids` by `part`.

    Args:
        part: each id's part, 0 or 1 (any integer dtype).
        ids: the ids as placed (before `shift`), in input order.
        weights: their weights, or None.
        lens: ids per bag of each feature, feature after feature (n_features × stride).
        n_features: the group's features.
        stride: the batch size (bags per feature).
        shift: per member (2 × n_features), subtracted from its ids once placed.
    """
    n = ids.numel()
    idx = torch.int32 if n < routing.INT32_CODES else torch.int64  # positions' dtype
    part = part.to(idx)
    ones_before = torch.zeros(n + 1, dtype=idx, device=ids.device)  # part-1 ids before each id
    ones = torch.cumsum(part, 0, dtype=idx, out=ones_before[1:])  # … up to and with it
    n0 = n - int(ones_before[-1])
    # part 0: the part-0 ids before it, at − ones; part 1: n0 + ones − 1
    zeros_before = torch.arange(n, dtype=idx, device=ids.device).sub_(ones)
    to_part_1 = torch.sub(ones, zeros_before).add_(n0 - 1).mul_(part)
    pos = zeros_before.add_(to_part_1).long()
    n_bags = lens.numel()
    bag_starts = lens.new_zeros(n_bags + 1)
    torch.cumsum(lens, 0, out=bag_starts[1:])
    ones_at = ones_before[bag_starts]  # each bag's part-1 count: the rise across it
    counts = lens.new_empty(2 * n_bags)
    torch.sub(ones_at[1:], ones_at[:-1], out=counts[n_bags:])
    torch.sub(lens, counts[n_bags:], out=counts[:n_bags])
    starts = routing.member_starts(counts, 2 * n_features, stride)
    return Partition(ids, weights, pos, counts, starts, shift)
