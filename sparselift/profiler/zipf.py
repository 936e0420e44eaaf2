"""Fit a Zipf exponent to observed id frequencies.

Why not a log-log line through the rank-frequency plot, or fbgemm's
`tbe_estimate_indices_distribution`? Both read the sampled frequencies as if they were the true
ones: with a few lookups per row the tail of the sorted counts is sampling noise, so uniform ids
look skewed and skewed ids look flatter than they are (tests/test_profiler_stats.py keeps the
comparison with fbgemm's estimate). Here the model includes the sampling: row j (popularity rank
j of N) is hit Poisson(n·p_j) times, p_j ∝ ∫_j^{j+1} x^-alpha dx (the law `SyntheticBatches` draws
from), and alpha maximizes the likelihood of the observed *count spectrum* — how many rows were
hit 0, 1, 2, 3–4, 5–8, … times — which needs no knowledge of which row is which.
"""

from __future__ import annotations

import math

import torch

_EXACT_ROWS = 2048  # popularity ranks evaluated one by one; beyond, in geometric groups
_GROUP_RATIO = 1.01
_ALPHA_MAX = 4.0


def _rank_groups(rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo, hi, weight): groups of popularity ranks [lo, hi) covering 1..rows."""
    exact = torch.arange(1, min(rows, _EXACT_ROWS) + 1, dtype=torch.float64)
    los, his = [exact], [exact + 1]
    if rows > _EXACT_ROWS:
        n = math.ceil(math.log((rows + 1) / (_EXACT_ROWS + 1)) / math.log(_GROUP_RATIO))
        edges = torch.unique(
            torch.floor(
                (_EXACT_ROWS + 1) * _GROUP_RATIO ** torch.arange(n + 1, dtype=torch.float64)
            )
        )
        edges = torch.cat(
            [edges[edges < rows + 1], torch.tensor([rows + 1.0], dtype=torch.float64)]
        )
        los.append(edges[:-1])
        his.append(edges[1:])
    lo, hi = torch.cat(los), torch.cat(his)
    return lo, hi, hi - lo


def _mass(lo: torch.Tensor, hi: torch.Tensor, alpha: float) -> torch.Tensor:
    """∫_lo^hi x^-alpha dx, normalized over all groups."""
    if abs(alpha - 1.0) < 1e-9:
        m = torch.log(hi) - torch.log(lo)
    else:
        e = 1.0 - alpha
        m = (hi.pow(e) - lo.pow(e)) / e
    return m / m.sum()


def _bins(max_count: int) -> list[int]:
    """Lower edges of the count bins: 0, 1, 2, 3, 5, 9, 17, … (then to infinity)."""
    edges, c = [0, 1, 2, 3], 5
    while edges[-1] <= max_count and c <= max_count:
        edges.append(c)
        c = 2 * c - 1
    return edges


def _expected_bin_share(lo, hi, w, n: int, alpha: float, edges: list[int]) -> torch.Tensor:
    """Expected share of rows whose Poisson hit count falls in each bin."""
    mass = _mass(lo, hi, alpha)
    lam = (n * mass / w).clamp_min(1e-300)  # per-row rate inside each group
    cdf = [torch.zeros_like(lam)]
    for e in edges[1:]:  # P(count <= e - 1) = Q(e, lam)
        cdf.append(torch.special.gammaincc(torch.tensor(float(e), dtype=torch.float64), lam))
    cdf.append(torch.ones_like(lam))
    probs = torch.stack([cdf[i + 1] - cdf[i] for i in range(len(edges))])  # bins × groups
    return (probs * w).sum(dim=1) / w.sum()


def fit_zipf_alpha(counts: torch.Tensor, num_rows: int) -> float:
    """Zipf exponent of a table with `num_rows` rows from its observed per-id hit `counts` (> 0)."""
    counts = counts[counts > 0].to(torch.int64)
    n = int(counts.sum())
    if n == 0 or counts.numel() < 2 or num_rows < 2:
        return float("nan")
    num_rows = max(num_rows, int(counts.numel()))
    edges = _bins(int(counts.max()))
    idx = torch.bucketize(counts, torch.tensor(edges[1:]), right=True)
    observed = torch.bincount(idx, minlength=len(edges)).to(torch.float64)
    observed[0] += num_rows - counts.numel()  # rows never hit
    lo, hi, w = _rank_groups(num_rows)

    def nll(alpha: float) -> float:
        share = _expected_bin_share(lo, hi, w, n, alpha, edges).clamp_min(1e-300)
        return float(-(observed * share.log()).sum())

    a, b = 0.0, _ALPHA_MAX  # golden-section search; the likelihood is unimodal in alpha
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = nll(c), nll(d)
    while b - a > 1e-3:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = nll(d)
    best = (a + b) / 2
    return 0.0 if nll(0.0) <= nll(best) else round(best, 4)
