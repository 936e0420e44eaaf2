"""What one more model-parallel sharding type costs a step beyond the calls the fits price.

TorchRec's sharded module runs each sharding type apart: its features are split out of the
batch, its input distribution, lookup and output distribution get their own awaitables, and its
pooled output is permuted into the module's. The calls are traced and fitted per kind; the
framework work around them is not, so it stays in each profile's dense residual (what the step
leaves once the modelled sparse path is taken out). Profiles of one job that run different
numbers of model-parallel sharding types measure it: how the residual grows per type (per type
in each collection: each collection runs its types apart). The optimizer prices it with each
type's fixed costs (`Coefficients.type_overhead_s`).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparselift.analysis.volumes import SHARDED


@dataclass(frozen=True)
class DenseFit:
    """The dense step and the per-type overhead fitted from profiles' residuals.

    Attributes:
        dense_step_s: the residual left at no model-parallel sharding type (≥ 0).
        type_overhead_s: seconds per step one model-parallel sharding type adds (≥ 0); None
            where every profile ran as many types (nothing measures it).
    """

    dense_step_s: float
    type_overhead_s: float | None

    def residual_at(self, types: int) -> float:
        """The residual this fit gives a profile or plan of `types` model-parallel types."""
        return self.dense_step_s + (self.type_overhead_s or 0.0) * types


def profiled_sharding_types(manifests: Iterable[Mapping[str, Any]]) -> list[str]:
    """The sharding types any of the profiles ran (their manifests' `sharding`), sorted: whose
    collectives the fits have seen."""
    return sorted(
        {
            str(e["sharding_type"])
            for m in manifests
            for e in m.get("sharding") or []
            if isinstance(e, Mapping) and e.get("sharding_type")
        }
    )


def model_parallel_types(manifest: Mapping[str, Any]) -> int:
    """How many model-parallel sharding types (`volumes.SHARDED`) the profile's plan ran, each
    collection's counted apart (each runs its own); 0 without a record."""
    return len(
        {
            (e.get("module"), e["sharding_type"])
            for e in manifest.get("sharding") or []
            if isinstance(e, Mapping) and e.get("sharding_type") in SHARDED
        }
    )


def fit_dense(residuals: Sequence[float], types: Sequence[int]) -> DenseFit:
    """The dense step and per-type overhead from each profile's residual and type count.

    The profiles with the fewest types give the residual there (their median); each profile
    with more gives its excess over it per extra type, and the overhead is the median of
    those (a type never saves framework work: at least 0). The dense step is the residual at
    the fewest types less that many overheads, so that every type is priced alike.

    Args:
        residuals: each profile's dense residual, seconds.
        types: each profile's model-parallel sharding types (`model_parallel_types`).
    Returns:
        The DenseFit; its overhead None where every profile ran as many types.
    Raises:
        ValueError: no residuals, or the two sequences differ in length.
    """
    if not residuals or len(residuals) != len(types):
        raise ValueError("fit_dense needs one type count per residual, and at least one")
    pairs = list(zip(residuals, types, strict=True))
    least = min(types)
    base = statistics.median(r for r, n in pairs if n == least)
    per_type = [(r - base) / (n - least) for r, n in pairs if n > least]
    if not per_type:
        return DenseFit(base, None)
    overhead = max(0.0, statistics.median(per_type))
    return DenseFit(max(0.0, base - overhead * least), overhead)
