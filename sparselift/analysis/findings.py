"""The few numbers a report opens with: step time, where it goes, the critical sparse stage.

All of them are about the slowest rank of each profiled step (the rank the others wait for at the
step's collectives), averaged over the profiled steps, so that the parts add up to the step time
and the critical stage is the one on the same rank (`summary.critical_path`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd

from sparselift.analysis.names import SPARSE_STAGES

MIB = 2**20
# main-thread parts of a step (they add up to it), as people read them
STEP_PARTS = {
    "sparse_compute_s": "sparse compute",
    "exposed_comm_s": "exposed communication",
    "dense_compute_s": "dense compute",
    "idle_s": "idle",
}


def fmt_ms(seconds: float, unit: bool = True) -> str:
    """Seconds as milliseconds with about three significant digits ("12.1 ms", "0.59 ms")."""
    ms = seconds * 1e3
    text = f"{ms:,.0f}" if abs(ms) >= 100 else f"{ms:.1f}" if abs(ms) >= 10 else f"{ms:.2f}"
    return f"{text} ms" if unit else text


def fmt_mib(nbytes: float, unit: bool = True) -> str:
    """Bytes as MiB with about three significant digits ("3.00 MiB", "0.0341 MiB")."""
    mib = nbytes / MIB
    text = f"{mib:,.0f}" if abs(mib) >= 100 else f"{mib:.2f}" if abs(mib) >= 1 else f"{mib:.3g}"
    return f"{text} MiB" if unit else text


def fmt_pct(share: float) -> str:
    """A share in [0, 1] as a whole percentage ("26 %")."""
    return f"{share * 100:.0f} %"


@dataclass(frozen=True)
class StepPart:
    """One part of the step: what it is, its seconds and its share of the step."""

    name: str
    seconds: float
    share: float


@dataclass(frozen=True)
class CriticalStage:
    """The sparse stage that takes longest on the slowest rank.

    Attributes:
        kind: its op kind (input_dist, lookup_fwd, output_dist_fwd, output_dist_bwd, lookup_bwd).
        compute_s: main-thread compute, seconds per step.
        wait_s: exposed wait for its collectives, seconds per step.
        share: of the sparse path on that rank.
        collective_bytes: its collectives' tensor bytes per step (0: a lookup).
    """

    kind: str
    compute_s: float
    wait_s: float
    share: float
    collective_bytes: float

    @property
    def total_s(self) -> float:
        """Compute plus exposed wait, seconds per step."""
        return self.compute_s + self.wait_s


@dataclass(frozen=True)
class Findings:
    """What a profile says in a few lines (`str()`), also as HTML for reports and notebooks.

    Attributes:
        step_s: the slowest rank's step time, mean over the profiled steps.
        fastest_step_s: the fastest profiled step (slowest rank).
        steps: profiled steps.
        ranks: ranks profiled.
        imbalance: slowest rank's step over the ranks' mean, mean over steps (1.0: balanced).
        parts: where the step goes (STEP_PARTS), on the slowest rank.
        sparse_path_s: the sparse path's critical stages summed, seconds per step.
        sparse_collective_bytes: tensor bytes of the sparse path's collectives per step, on the
            slowest rank.
        critical: the longest sparse stage, None when no step has a sparse stage.
    """

    step_s: float
    fastest_step_s: float
    steps: int
    ranks: int
    imbalance: float
    parts: list[StepPart] = field(default_factory=list)
    sparse_path_s: float = 0.0
    sparse_collective_bytes: float = 0.0
    critical: CriticalStage | None = None

    def lines(self) -> list[str]:
        """The findings as sentences, step time first."""
        out = [
            f"Step time {fmt_ms(self.step_s)} (slowest rank, mean of {self.steps} profiled "
            f"steps; fastest {fmt_ms(self.fastest_step_s)}), {self.ranks} ranks, "
            f"imbalance {self.imbalance:.2f}x (slowest rank / mean rank).",
            "Where it goes: "
            + ", ".join(f"{p.name} {fmt_ms(p.seconds)} ({fmt_pct(p.share)})" for p in self.parts)
            + ".",
        ]
        c = self.critical
        if c is not None:
            moved = (
                f"; its collectives carry {fmt_mib(c.collective_bytes)} per step"
                if c.collective_bytes > 0
                else ""
            )
            out.append(
                f"Critical sparse stage: {c.kind} {fmt_ms(c.total_s)} (compute "
                f"{fmt_ms(c.compute_s)}, waiting {fmt_ms(c.wait_s)}), {fmt_pct(c.share)} of the "
                f"sparse path's {fmt_ms(self.sparse_path_s)}{moved}."
            )
        out.append(
            f"Sparse collectives carry {fmt_mib(self.sparse_collective_bytes)} per step on the "
            "slowest rank."
        )
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def _repr_html_(self) -> str:
        """HTML paragraphs (IPython's display hook; `report.render_html` uses it too)."""
        return "".join(f"<p>{html.escape(line)}</p>" for line in self.lines())


def key_findings(
    summary: pd.DataFrame, critical_path: pd.DataFrame, nodes: pd.DataFrame
) -> Findings:
    """The Findings of one analysis.

    Args:
        summary: `summary.summarize` output.
        critical_path: `summary.critical_path` output (same slowest rank per step).
        nodes: graph nodes (for the collectives' bytes).
    Returns:
        The Findings (means over the profiled steps).
    """
    slowest = summary.loc[summary.groupby("step")["step_s"].idxmax()]
    step_s = float(slowest["step_s"].mean())
    parts = [
        StepPart(name, float(slowest[col].mean()), _share(float(slowest[col].mean()), step_s))
        for col, name in STEP_PARTS.items()
    ]
    on_slowest = nodes.merge(slowest[["rank", "step"]], on=["rank", "step"])
    coll = on_slowest[(on_slowest["part"] == "collective")]
    n_steps = max(len(slowest), 1)
    sparse_bytes = float(coll[coll["stage"].isin(SPARSE_STAGES)]["bytes"].sum()) / n_steps
    critical, path_s = None, 0.0
    if len(critical_path):
        per_kind = critical_path.groupby("kind", sort=False)[["compute_s", "wait_s", "total_s"]]
        mean = per_kind.mean()
        path_s = float(mean["total_s"].sum())
        kind = str(mean["total_s"].idxmax())
        critical = CriticalStage(
            kind=kind,
            compute_s=float(mean.at[kind, "compute_s"]),
            wait_s=float(mean.at[kind, "wait_s"]),
            share=_share(float(mean.at[kind, "total_s"]), path_s),
            collective_bytes=float(coll[coll["kind"] == kind]["bytes"].sum()) / n_steps,
        )
    return Findings(
        step_s=step_s,
        fastest_step_s=float(slowest["step_s"].min()),
        steps=int(summary["step"].nunique()),
        ranks=int(summary["rank"].nunique()),
        imbalance=float(slowest["imbalance_step"].mean()),
        parts=parts,
        sparse_path_s=path_s,
        sparse_collective_bytes=sparse_bytes,
        critical=critical,
    )


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0
