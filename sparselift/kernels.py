"""What an embedding lookup costs, in the unit both the calibration and the cost model count.

On GPUs a table-batched lookup moves elements through memory: it reads the ids (8 bytes, two
elements each), gathers `ids·dim` (a row occupies 32 lanes at least) and writes `bags·dim` pooled
outputs, so their sum is its unit, scaled up for rows narrower than a warp's pass.

FBGEMM's CPU kernels behave differently: their time grows with the ids, with the *distinct rows
touched* and with the pooled outputs written, and the backward (which dominates) is paid mostly
per distinct row. So a table served to every rank (table-wise, column-wise) pays for the unique
rows of all ranks' ids, column-wise shards each pay it again, and row-wise shards split it but
write every rank's bags on every rank. The CPU unit is therefore `ids + κ · unique + μ · bags ·
dim`, κ and μ the measured ratios below (`benchmarks/bench_lookup_kernel.py` measures them); the
calibration fits seconds per unit from the profile's own traces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

ID_BYTES, LENGTH_BYTES, FLOAT_BYTES = 8, 4, 4  # an id, a bag length, an embedding element


def ring_allreduce_bytes(world: int, nbytes: float) -> float:
    """Bytes each of `world` ranks sends in a ring all-reduce of `nbytes` (reduce-scatter then
    all-gather: 2·(W−1)/W of them), as data-parallel gradients are priced on both sides of the
    calibration (the optimizer's counts, the analysis's modelled sparse path)."""
    return 2.0 * (world - 1) / world * nbytes


def both_ends(device: str) -> bool:
    """Whether a distribution's bytes cost a rank at both ends, sent and received: on CPU (gloo
    between ranks of a host), whose ranks' own CPUs copy both, so the same bytes take about as
    long balanced as all one way (`benchmarks/bench_dist_calls.py`: 1.0-1.35x across runs,
    where charging the sender alone says 1.9x); NCCL's links carry both directions at once."""
    return device != "cuda"


# κ: one distinct row costs κ ids; μ: one pooled output element costs μ ids (FBGEMM, one CPU thread)
CPU_UNIQUE_WEIGHT = {"lookup_fwd": 5.0, "lookup_bwd": 41.0}
CPU_BAG_WEIGHT = {"lookup_fwd": 0.22, "lookup_bwd": 0.06}
# A distinct row costs more the larger its shard (caches, TLB): φ ids more for each doubling of the
# shard past FOOTPRINT_FLOOR_BYTES. Only a calibration measures φ (none: no such term). The floor is
# assumed: how well φ explains profiles' lookups hardly changes between 8 and 32 MiB.
FOOTPRINT_FLOOR_BYTES = 16 << 20


def footprint_doublings(nbytes: float) -> float:
    """How many times a shard of `nbytes` doubles FOOTPRINT_FLOOR_BYTES (0 at or below it)."""
    return math.log2(nbytes / FOOTPRINT_FLOOR_BYTES) if nbytes > FOOTPRINT_FLOOR_BYTES else 0.0


def footprint_far(unique: float, rows: float, cols: float) -> float:
    """A shard's `far` (`lookup_work`): its distinct rows times the doublings of its fp32
    `rows` × `cols` past the floor, as the analysis and the optimizer both count it."""
    return unique * footprint_doublings(rows * cols * FLOAT_BYTES)


@dataclass(frozen=True)
class LookupUnit:
    """The CPU work unit's weights: one distinct row costs κ ids, one pooled element μ ids, and a
    distinct row φ ids more for each doubling of its shard past FOOTPRINT_FLOOR_BYTES.

    κ and μ default to the kernel benchmark's, φ to 0 (no footprint term); a calibration that can
    tell the terms apart (calls of several plans mix ids, distinct rows, bags and shard sizes
    differently) refits them for the profiled host.
    """

    unique_fwd: float = CPU_UNIQUE_WEIGHT["lookup_fwd"]
    unique_bwd: float = CPU_UNIQUE_WEIGHT["lookup_bwd"]
    bag_fwd: float = CPU_BAG_WEIGHT["lookup_fwd"]
    bag_bwd: float = CPU_BAG_WEIGHT["lookup_bwd"]
    footprint_fwd: float = 0.0
    footprint_bwd: float = 0.0

    def footprint(self, kind: str) -> float:
        """φ of lookup kind "lookup_fwd" or "lookup_bwd" (another kind: the backward's)."""
        return self.footprint_fwd if kind == "lookup_fwd" else self.footprint_bwd

    def weights(self, kind: str) -> tuple[float, float]:
        """(κ, μ) of lookup kind "lookup_fwd" or "lookup_bwd".

        Raises:
            KeyError: another kind.
        """
        if kind not in ("lookup_fwd", "lookup_bwd"):
            raise KeyError(kind)
        fwd = kind == "lookup_fwd"
        return (self.unique_fwd, self.bag_fwd) if fwd else (self.unique_bwd, self.bag_bwd)


KERNEL_UNIT = LookupUnit()

# Fixed cost of one call on a CPU rank, measured on its own: a profile sees about one size per call
# and cannot tell a call's fixed cost from its size by itself. Lookups: FBGEMM's CPU kernel
# (benchmarks/bench_lookup_kernel.py); distributions: TorchRec's KJTAllToAll (input_dist) and
# PooledEmbeddingsAllToAll (output_dist, forward and backward) between gloo ranks
# (benchmarks/bench_dist_calls.py).
CPU_CALL_S = {
    "lookup_fwd": 1.9e-4,
    "lookup_bwd": 1.1e-4,
    "input_dist": 8.5e-4,
    "output_dist_fwd": 3.4e-4,
    "output_dist_bwd": 5.0e-4,
}
CPU_DIST_B_S = 2e-9  # seconds per byte of a distribution call, host work and wire together
# seconds per work unit of FBGEMM's CPU TBE, one thread (benchmarks/bench_lookup_kernel.py)
CPU_WORK_B_S = {"lookup_fwd": 3.2e-9, "lookup_bwd": 1.1e-8}


def gpu_row_penalty(dim: float) -> float:
    """How much more a GPU lookup costs per element for rows of `dim` than for rows ≥ 128 wide.

    A TBE warp moves 128 elements of a row per pass; narrower rows leave part of it idle. The
    factors are TorchRec's empirical HALF_BLOCK and QUARTER_BLOCK penalties, the best public
    measure until a GPU profile calibrates the lookup (it fits seconds per unit, so only their
    ratio matters).
    """
    return 1.0 if dim >= 128 else 1.15 if dim >= 64 else 1.75


def lookup_work(
    kind: str,
    device: str,
    ids: float,
    unique: float,
    dim: float,
    bag_elems: float = 0.0,
    unit: LookupUnit = KERNEL_UNIT,
    far: float = 0.0,
) -> float:
    """Units of work of one lookup call, the unit its time is fitted per.

    Args:
        kind: "lookup_fwd" or "lookup_bwd" (backward with the fused optimizer).
        device: "cuda" or "cpu".
        ids: ids looked up.
        unique: distinct rows among them (CPU only).
        dim: the rows' width (CUDA only).
        bag_elems: pooled output elements written (bags × dim, summed over the call's tables).
        unit: the CPU unit's weights (the kernel benchmark's unless a calibration refitted them).
        far: distinct rows, each times its shard's doublings (`footprint_far`; CPU only).
    Returns:
        The work units.
    Raises:
        KeyError: an unknown `kind` on CPU.
    """
    if device == "cuda":  # read the ids (8 B = 2 elements), gather rows (32 lanes at least), bags
        return gpu_row_penalty(dim) * (ids * (2.0 + max(dim, 32.0)) + bag_elems)
    kappa, mu = unit.weights(kind)
    return ids + kappa * unique + mu * bag_elems + unit.footprint(kind) * far


def expected_unique(rows: int, alpha: float, draws: float) -> float:
    """Expected distinct rows among `draws` ids drawn from a Zipf(alpha) law over `rows` rows
    (0 for no draws or no rows)."""
    if draws <= 0 or rows <= 0:
        return 0.0
    return _expected_unique(int(rows), round(float(alpha), 3), float(draws))


@lru_cache(maxsize=100_000)
def _expected_unique(rows: int, alpha: float, draws: float) -> float:
    # Σ_k 1 − (1 − p_k)^n over ranks k, with ranks grouped in geometric buckets (p nearly constant).
    # p_k is the power law's mass on [k, k+1) — the law the synthetic generator samples and the
    # profiler fits — which differs from the discrete 1/k^α only in the head.
    # float edges (floored), not int64: a row count past int64 must not overflow
    edges = np.unique(np.floor(np.geomspace(1.0, float(rows) + 1.0, num=min(rows, 2000) + 1)))
    lo, hi = edges[:-1], edges[1:]
    k = np.floor(np.sqrt(lo * hi))
    if alpha == 0:
        p = np.full(len(k), 1.0 / rows)
    else:
        g = np.log if abs(alpha - 1) < 1e-9 else (lambda x: x ** (1 - alpha) / (1 - alpha))
        p = (g(k + 1) - g(k)) / (g(rows + 1.0) - g(1.0))
    return float(np.sum((hi - lo) * -np.expm1(draws * np.log1p(-np.minimum(p, 1 - 1e-12)))))


def expected_unique_past(
    rows: int, alpha: float, draws: float, head: int, head_share: float | None = None
) -> float:
    """Expected distinct rows among `draws` ids drawn from a Zipf(alpha) law over `rows` rows
    with its `head` hottest rows taken out (the law past them, renormalized): what the cold part
    of a hot/cold split touches. Its draws are what the whole table takes to put `draws` ids past
    the head (`head_share` of its ids on the head: measured where given, else the law's); the
    head's own distinct rows among those are then left out."""
    head = max(0, min(int(head), int(rows)))
    if head == 0:
        return expected_unique(rows, alpha, draws)
    p = _head_mass(rows, alpha, head)
    tail = 1.0 - (float(p.sum()) if head_share is None else head_share)
    if draws <= 0 or tail <= 0:
        return 0.0
    whole = draws / tail
    seen_head = float(np.sum(-np.expm1(whole * np.log1p(-np.minimum(p, 1 - 1e-12)))))
    return max(0.0, expected_unique(rows, alpha, whole) - seen_head)


def _head_mass(rows: int, alpha: float, head: int) -> np.ndarray:
    """The law's mass on each of the `head` hottest ranks, as `_expected_unique` takes it."""
    if alpha == 0:
        return np.full(head, 1.0 / rows)
    k = np.arange(1, head + 1, dtype=float)
    g = np.log if abs(alpha - 1) < 1e-9 else (lambda x: x ** (1 - alpha) / (1 - alpha))
    return (g(k + 1) - g(k)) / (g(rows + 1.0) - g(1.0))


def zipf_share(n: int, alpha: float, fraction: float) -> float:
    """Share of Zipf(alpha) draws over n rows that fall on the hottest ceil(fraction·n) rows."""
    return zipf_top_share(n, alpha, max(1, math.ceil(fraction * n)))


def zipf_top_share(n: int, alpha: float, k: int) -> float:
    """Share of Zipf(alpha) draws over n rows that fall on the hottest k rows."""
    return 1.0 if k >= n else _harmonic(k, alpha) / _harmonic(n, alpha)


def _harmonic(n: int, a: float) -> float:
    # generalized harmonic number, Euler–Maclaurin tail beyond 1000 terms (exact enough for shares)
    m = min(n, 1000)
    s = sum(i**-a for i in range(1, m + 1))
    if n > m:
        if abs(a - 1.0) < 1e-9:
            s += math.log(n / m)
        else:
            s += (n ** (1 - a) - m ** (1 - a)) / (1 - a)
    return s
