"""Reconstruction on real fixture traces (tests/fixtures/profile_tiny_*, from make_fixtures.py)."""

from pathlib import Path

import pytest

from sparselift.analysis.edges import STAGE_ORDER
from sparselift.analysis.pipeline import analyze

FIX = Path(__file__).parent / "fixtures"
# each fixture's plan and the sharding types it runs (data_parallel: three of tiny's tables)
TYPES = {
    "table_wise": {"table_wise"},
    "row_wise": {"row_wise"},
    "data_parallel": {"data_parallel", "table_wise"},
}
PLANS = tuple(TYPES)


@pytest.fixture(scope="module", params=PLANS)
def analysis(request):
    return request.param, analyze(FIX / f"profile_tiny_{request.param}", cache=False)


def test_steps_add_up_within_5_percent(analysis):
    _, a = analysis
    s = a.summary
    assert len(s) == 2 * 6
    assert ((s["accounted_s"] - s["step_s"]).abs() <= 0.05 * s["step_s"]).all()
    parts = s["sparse_compute_s"] + s["dense_compute_s"] + s["exposed_comm_s"] + s["idle_s"]
    assert ((parts - s["step_s"]).abs() <= 0.05 * s["step_s"]).all()


def test_every_module_has_all_stages(analysis):
    plan, a = analysis
    n = a.nodes
    mods = n[n["stage"] == "lookup"]["module"].unique()
    assert list(mods) == ["model.sparse_arch.embedding_bag_collection"]
    for (rank, step), g in n[n["module"] == mods[0]].groupby(["rank", "step"]):
        assert set(STAGE_ORDER) <= set(g["kind"]), (rank, step, set(g["kind"]))
        assert set(g[g["stage"] == "lookup"]["sharding"]) == TYPES[plan]
        lk = g[(g["kind"] == "lookup_fwd") & (g["part"] == "compute")]
        assert (lk["ids"] > 0).all() and (lk["x"] > 0).all() and (lk["tables"] != "").all()
        coll = g[g["part"] == "collective"]
        assert (coll["bytes"] > 0).all() and (coll["resource"] == "network").all()


def test_collectives_pair_across_ranks(analysis):
    _, a = analysis
    coll = a.nodes[a.nodes["part"] == "collective"]
    assert not a.unplaced
    for key, g in coll.groupby("coll_key"):
        assert sorted(g["rank"]) == [0, 1], key
        assert g["coll_op"].nunique() == 1, key
        assert (g["transfer_s"] <= g["dur_s"] + 1e-12).all()
    peers = a.edges[a.edges["kind"] == "peer"]
    assert len(peers) == coll["coll_key"].nunique()


def test_edges_follow_the_sparse_path(analysis):
    _, a = analysis
    n = a.nodes.set_index("node_id")
    data = a.edges[a.edges["kind"] == "data"]
    pairs = {
        (n.at[s, "kind"], n.at[d, "kind"]) for s, d in zip(data["src"], data["dst"], strict=True)
    }
    assert pairs == set(zip(STAGE_ORDER, STAGE_ORDER[1:], strict=False))


def test_critical_path_and_imbalance(analysis):
    _, a = analysis
    cp, s = a.critical_path, a.summary
    assert list(cp.groupby("step").size()) == [5] * 6
    # the critical path follows each step's slowest rank
    slowest = s.loc[s.groupby("step")["step_s"].idxmax()].set_index("step")["rank"]
    assert (cp.groupby("step")["rank"].first() == slowest).all()
    # imbalance is that step's max ÷ mean over ranks
    by = s.groupby("step")["step_s"]
    assert s["imbalance_step"].values == pytest.approx(
        (by.transform("max") / by.transform("mean")).values
    )
