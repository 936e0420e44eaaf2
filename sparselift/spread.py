"""The expected slowest rank when each rank's predicted time errs: `expected_max`, `premium_s`.

A step waits for its slowest rank. Where each rank's predicted time errs by a random amount, the
slowest rank ends, on average, later than the largest prediction: two ranks predicted alike, each
off by σ, end σ/√π later. A plan balanced on predicted costs is balanced on their errors too, so
pricing it at the largest prediction flatters it against an unbalanced plan, whose slowest rank is
clear of the others. Both the calibration (a profile's dense residual) and the cost model (a plan's
step) add this premium, with the rank spread the calibration measured.

Kept beside `kernels` (no stage's imports): analysis and the optimizer price it alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

_SQRT2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / _SQRT2))


def _pdf(z: float) -> float:
    return _INV_SQRT_2PI * math.exp(-0.5 * z * z)


def expected_max(means: Sequence[float], sigmas: Sequence[float]) -> float:
    """E[max_i X_i] for independent normal X_i ~ N(means[i], sigmas[i]²), by Clark's moments.

    Clark (1961) gives the first two moments of the maximum of two normals exactly; the maximum of
    many is folded in one variable at a time, each partial maximum taken as normal with those
    moments. Exact for two variables; for more, it errs by a few per cent of σ (the tests check it
    against sampling). Deterministic and O(n), so the optimizer can price every plan with it.

    Args:
        means: each variable's mean (at least one).
        sigmas: each one's standard deviation (≥ 0), as many as `means`.
    Returns:
        The expected maximum; max(means) where every sigma is 0.
    Raises:
        ValueError: no variables, lengths differ, or a negative sigma.
    """
    if not means or len(means) != len(sigmas):
        raise ValueError("expected_max needs one sigma per mean, and at least one mean")
    if any(s < 0 for s in sigmas):
        raise ValueError("expected_max: a standard deviation is negative")
    m1, v1 = float(means[0]), float(sigmas[0]) ** 2
    for m2, s2 in zip(means[1:], sigmas[1:], strict=True):
        v2 = float(s2) ** 2
        theta = math.sqrt(v1 + v2)
        if theta <= 1e-15 * max(1.0, abs(m1), abs(m2)):
            m1, v1 = max(m1, m2), max(v1, v2)
            continue
        a = (m1 - m2) / theta
        p, q, d = _cdf(a), _cdf(-a), _pdf(a)
        first = m1 * p + m2 * q + theta * d
        second = (m1 * m1 + v1) * p + (m2 * m2 + v2) * q + (m1 + m2) * theta * d
        m1, v1 = first, max(second - first * first, 0.0)
    return m1


def premium_s(means: Sequence[float], sigmas: Sequence[float]) -> float:
    """How much later than the largest of `means` the slowest rank ends on average (≥ 0).

    Args:
        means: each rank's predicted seconds.
        sigmas: each rank's standard error of that prediction, seconds.
    Returns:
        expected_max(means, sigmas) − max(means), 0.0 for no ranks.
    """
    if not means:
        return 0.0
    return max(0.0, expected_max(means, sigmas) - max(means))
