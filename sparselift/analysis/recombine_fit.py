"""The split model's recombination cost fitted from the profiles' timings: `ops["recombine"]`.

A model with split tables recombines the virtual features' pooled embeddings into the original
features' ones every step (`sparselift.plans.rewrite.recombine`: views split, row parts added,
everything concatenated; forward and backward). The profiler times it on the profiled device
with the model's pooled widths and the rank's batch (`sparselift.profiler.recombine_cost`):
each sample is one set of tables split hot/cold, with the pooled elements of the split tables'
parts it reads and the model's whole pooled output it writes. The optimizer prices the
recombination as `recombine_b_s` per element of the two together (per rank and step, forward
and backward), so the fit is seconds ≈ b_s · (read + written), least squares through the origin,
b_s ≥ 0 (a_s is 0: a fixed cost per call is not in the optimizer's model, and through the origin
the fit charges it to the elements, which only prices a split higher).

Pure numpy: the analysis and the profiler both call it, and neither needs torch for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparselift.analysis.transform_fit import recorded_samples
from sparselift.calibration import RECOMBINE_UNIT, OpFit

RECOMBINE = "recombine"  # the op kind in calibration.json and the manifest's key


@dataclass(frozen=True)
class RecombineSample:
    """One timed recombination: it read `read` pooled elements of split tables' parts and wrote
    `written` (the model's pooled output), forward and backward, in `seconds`."""

    read: int
    written: int
    seconds: float


def fit_recombine(samples: Sequence[RecombineSample]) -> OpFit | None:
    """seconds ≈ b_s · (read + written) over `samples`, through the origin, b_s ≥ 0.

    Args:
        samples: the timings (any number).
    Returns:
        The OpFit (x = "elements", a_s = 0, b_s per element, r2 against the samples' mean, which
        can be < 0 for a fit through the origin; n = samples), or None without a sample of any
        element.
    """
    rows = [s for s in samples if s.read + s.written > 0]
    if not rows:
        return None
    x = np.array([s.read + s.written for s in rows], dtype=float)
    y = np.array([s.seconds for s in rows], dtype=float)
    b = max(0.0, float(x @ y) / float(x @ x))
    spread = float(((y - y.mean()) ** 2).sum())
    r2 = float(1 - ((y - b * x) ** 2).sum() / spread) if spread > 0 else 1.0
    return OpFit(x=RECOMBINE_UNIT, a_s=0.0, b_s=b, r2=r2, n=len(rows), calls=1.0)


def recombine_samples_of(manifest: Mapping[str, Any], where: str) -> list[RecombineSample]:
    """The recombination timings a profile manifest records (its `recombine.samples`).

    Args:
        manifest: the profile's manifest.json object.
        where: what to name in messages (the manifest's path).
    Returns:
        The samples; [] where the manifest has no record (an older profile, or the timing
        failed).
    Raises:
        UserError: the record is there but malformed; the message names `where` and the
            sample.
    """
    rows = recorded_samples(manifest, RECOMBINE, ("read", "written", "seconds"), (), where)
    return [RecombineSample(int(r["read"]), int(r["written"]), float(r["seconds"])) for r in rows]
