"""The two-part stable partition of a routed group's ids, for `transform.BatchTransform`.

Every split kind but a row-range split in three or more parts routes each id to one of two
parts. Their ids are partitioned without a division per id: an id of part 0 goes after the
part-0 ids before it, an id of part 1 after every part-0 id and the part-1 ids before it. One
cumulative sum gives both positions and one scatter places each id, straight into the
transform's output where the group's parts are one block of it. Each bag's part-1 count is the
sum's rise across the bag, so no per-part pass over the ids is needed.
"""

from __future__ import annotations

import dataclasses

import torch

from sparselift.plans.routing import INT32_CODES, Stream


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

    def write(self, out_v: torch.Tensor, out_w: torch.Tensor | None, a: int, b: int) -> None:
        """Write members [a, b) of the stream into `out_v` (and `out_w`), views of exactly
        their length: scattered there when they are the whole stream, else copied from the
        stream, placed once."""
        if (a, b) == (0, len(self.prefix) - 1):
            self._place(out_v, out_w)
            return
        s = self.stream()
        lo, hi = self.prefix[a], self.prefix[b]
        out_v.copy_(s.values[lo:hi])
        if out_w is not None and s.weights is not None:
            out_w.copy_(s.weights[lo:hi])

    def stream(self) -> Stream:
        """The stream, placed in a buffer of its own (once)."""
        if self._stream is None:
            v = torch.empty_like(self.ids)
            w = None if self.weights is None else torch.empty_like(self.weights)
            self._place(v, w)
            self._stream = Stream(v, w, self.counts, self.prefix)
        return self._stream

    def _place(self, out_v: torch.Tensor, out_w: torch.Tensor | None) -> None:
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
    idx = torch.int32 if n < INT32_CODES else torch.int64
    part = part.to(idx)
    ones = torch.cumsum(part, 0, dtype=idx)  # part-1 ids up to and with each id
    n0 = n - (int(ones[-1]) if n else 0)
    at = torch.arange(n, dtype=idx, device=ids.device)
    # part 0: at − ones; part 1: n0 + ones − 1 = at − ones + (n0 − 1 + 2·ones − at)
    neg = torch.add(at, ones, alpha=-2).sub_(n0 - 1).mul_(part)
    pos = at.sub_(ones).sub_(neg).long()
    if n:
        last = lens.cumsum(0).sub_(1)  # each bag's last id
        ones_to = ones[last.clamp(min=0)].mul_(last >= 0)
        per_bag_1 = torch.diff(ones_to, prepend=ones_to.new_zeros(1)).to(lens.dtype)
    else:
        per_bag_1 = torch.zeros_like(lens)
    counts = torch.cat([lens - per_bag_1, per_bag_1])
    per_member = counts.view(2 * n_features, stride).sum(1).tolist()
    prefix = [0]
    for c in per_member:
        prefix.append(prefix[-1] + c)
    return Partition(ids, weights, pos, counts, prefix, shift)
