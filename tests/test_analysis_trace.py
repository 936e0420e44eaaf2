"""Trace loading: real CPU fixture traces, and a CUDA trace.

The CUDA trace below is HAND-WRITTEN (no GPU here), following the Kineto chrome-trace format:
cpu_op / user_annotation on the Python thread, cuda_runtime `cudaLaunchKernel` with `correlation`,
`kernel` events on device pid 0 with `stream`/`correlation`, an NCCL all-to-all kernel on its own
stream, and a gpu_memcpy with `bytes`.
"""

from pathlib import Path

from sparselift.analysis.reconstruct import rank_nodes
from sparselift.analysis.trace import load_trace, parse_trace

FIX = Path(__file__).parent / "fixtures"


def test_cpu_trace_columns():
    tr = load_trace(FIX / "profile_tiny_table_wise" / "rank0.trace.json.gz", cache=False)
    ev = tr.events
    assert tr.rank == 0 and tr.world_size == 2 and not tr.is_cuda
    assert {"cpu_op", "user_annotation"} <= set(ev["cat"])
    gloo = ev[ev["name"].str.startswith("gloo:")]
    assert len(gloo) and gloo["thread"].str.contains("gloo").all()
    assert ev["ts"].is_monotonic_increasing
    assert (ev["end"] >= ev["ts"]).all()


def _x(name, cat, ts, dur, tid=100, pid=1, **args):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def cuda_trace() -> dict:
    M = "model.sparse_arch.embedding_bag_collection"
    ev = [
        {
            "ph": "M",
            "name": "thread_name",
            "pid": 1,
            "tid": 100,
            "args": {"name": "thread 100 (python)"},
        },
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
        _x("ProfilerStep#0", "user_annotation", 0, 1000),
        _x("## forward ##", "user_annotation", 10, 500),
        _x(f"[splits_dist]_[{M}]_[table_wise]", "user_annotation", 20, 100),
        _x(
            "c10d::alltoall_base_",
            "cpu_op",
            30,
            50,
            **{"Input Dims": [[512], [512]], "Input type": ["long int"] * 2},
        ),
        _x("cudaLaunchKernel", "cuda_runtime", 40, 10, correlation=11),
        _x(f"[lookup]_[{M}]_[table_wise]", "user_annotation", 130, 200),
        _x(
            "fbgemm::bounds_check_indices",
            "cpu_op",
            140,
            20,
            **{"Input Dims": [[4], [2000], [1025]]},
        ),
        _x(
            "fbgemm::split_embedding_codegen_lookup_rowwise_adagrad_function_pt2",
            "cpu_op",
            170,
            100,
        ),
        _x("cudaLaunchKernel", "cuda_runtime", 180, 10, correlation=12),
        _x(f"[output_dist]_[{M}]_[table_wise]", "user_annotation", 340, 100),
        _x(
            "c10d::alltoall_base_",
            "cpu_op",
            350,
            50,
            **{"Input Dims": [[256, 64]], "Input type": ["float"]},
        ),
        _x("cudaLaunchKernel", "cuda_runtime", 360, 10, correlation=13),
        _x("cudaStreamSynchronize", "cuda_runtime", 520, 470, correlation=14),
        # device side
        _x(
            "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            60,
            80,
            tid=20,
            pid=0,
            device=0,
            stream=20,
            correlation=11,
        ),
        _x(
            "split_embedding_codegen_forward_unweighted_kernel",
            "kernel",
            200,
            120,
            tid=7,
            pid=0,
            device=0,
            stream=7,
            correlation=12,
        ),
        _x(
            "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            "kernel",
            380,
            200,
            tid=20,
            pid=0,
            device=0,
            stream=20,
            correlation=13,
        ),
        _x(
            "Memcpy HtoD (Pageable -> Device)",
            "gpu_memcpy",
            5,
            4,
            tid=7,
            pid=0,
            device=0,
            stream=7,
            correlation=10,
            bytes=4096,
        ),
    ]
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "deviceProperties": [{"id": 0, "name": "H100"}],
        "traceEvents": ev,
    }


def test_cuda_trace_streams_and_correlation():
    tr = parse_trace(cuda_trace(), "<hand-written cuda>")
    assert tr.is_cuda
    k = tr.events[tr.events["cat"] == "kernel"]
    assert set(k["stream"].astype(int)) == {7, 20}
    assert set(k["correlation"].astype(int)) == {11, 12, 13}
    assert int(tr.events.loc[tr.events["cat"] == "gpu_memcpy", "bytes"].iloc[0]) == 4096
    assert (
        tr.events.loc[tr.events["name"] == "ProfilerStep#0", "thread"].iloc[0]
        == "thread 100 (python)"
    )


def test_cuda_nccl_kernels_placed_by_correlation():
    tr = parse_trace(cuda_trace(), "<hand-written cuda>")
    one = rank_nodes(tr, 0)
    nodes, steps = one.nodes, one.steps
    assert not one.unplaced
    coll = nodes[nodes["part"] == "collective"].sort_values("start_us")
    assert list(coll["kind"]) == ["input_dist", "output_dist_fwd"]
    assert list(coll["thread"]) == ["0/20", "0/20"]  # the NCCL stream
    assert list(coll["bytes"]) == [512 * 8, 256 * 64 * 4]  # from the launching c10d op's shapes
    main = nodes[nodes["part"].isin(("compute", "wait", "idle"))]
    assert abs(main["dur_s"].sum() - steps["dur_s"].iloc[0]) < 1e-9
    lk = nodes[(nodes["kind"] == "lookup_fwd") & (nodes["part"] == "compute")]
    assert int(lk["ids"].iloc[0]) == 2000
    # the host blocked in cudaStreamSynchronize while the output all-to-all ran: exposed comm
    wait = nodes[(nodes["part"] == "wait")]
    assert set(wait["kind"]) == {"output_dist_fwd"}
