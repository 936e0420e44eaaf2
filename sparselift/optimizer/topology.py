"""The hardware to plan for: ranks, hosts, memory per rank, bandwidths and compute rates.

The target can differ from the profiled machine (what-if planning), so it is a small dataclass
described by a preset (`cpu-gloo`, `h100x8`, `h200x8`) or a JSON topology file
(`{"format": "sparselift-topology", "version": 1, ...}`). Bandwidths are bytes/s, memory bytes,
compute rates elements/s; everything the cost model needs beyond the calibration lives here.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparselift.errors import UserError
from sparselift.jsonfile import read_versioned

FORMAT = "sparselift-topology"
VERSION = 1
GiB = 1024**3
MAX_WORLD_SIZE = 2**16  # as plans allow (`sparselift.plans.types`)
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Topology:
    """One kind of host repeated `world_size / local_world_size` times."""

    world_size: int
    local_world_size: int
    device: str  # "cpu" | "cuda"
    preset: str | None = None
    hbm_bytes: int = 0  # per rank; 0 on CPU
    ddr_bytes: int = 64 * GiB  # per rank (host memory / ranks per host)
    memory_reserve_fraction: float = 0.15  # kept free for activations, dense model, allocator
    intra_host_bw: float = 5e9  # bytes/s per rank, all-to-all effective
    inter_host_bw: float = 12.5e9  # bytes/s per rank over the network
    collective_latency_s: float = 150e-6  # one all-to-all / allreduce launch
    lookup_rate: float = 4e8  # embedding elements (ids·dim) gathered per second, fwd
    bwd_multiplier: float = 3.0  # backward + fused optimizer vs forward
    kernel_latency_s: float = 20e-6  # one TBE launch
    hbm_to_ddr_bw: float = 0.0  # UVM: bytes/s the device reads host memory at; 0 = no UVM
    quant_rate: float = 3e8  # elements/s quantized or dequantized (qcomm fp16/bf16)
    pipeline_overlap: float = 0.0  # share of input_dist the sparse-dist pipeline hides
    pipeline_overhead_s: float = 60e-6  # sparse-dist bookkeeping per step (extra copies, syncs)
    dense_flops: float = 5e10  # dense MLP throughput, FLOP/s

    @property
    def num_hosts(self) -> int:
        """Hosts: world_size / local_world_size."""
        return self.world_size // self.local_world_size

    def host_of(self, rank: int) -> int:
        """The host `rank` sits on."""
        return rank // self.local_world_size

    def usable(self, capacity: int) -> int:
        """Bytes of `capacity` the tables may use (the reserve kept free)."""
        return int(capacity * (1.0 - self.memory_reserve_fraction))

    @property
    def has_uvm(self) -> bool:
        """Whether UVM caching exists: CUDA with a host-memory read bandwidth."""
        return self.device == "cuda" and self.hbm_to_ddr_bw > 0

    def to_dict(self) -> dict[str, Any]:
        """The topology file's content."""
        return {"format": FORMAT, "version": VERSION, **dataclasses.asdict(self)}

    def validate(self, where: str = "topology") -> Topology:
        """Check the values; returns self.

        Raises:
            UserError: a value is out of range (the message starts with `where`): a number
                that is negative, NaN or infinite, or more than MAX_WORLD_SIZE ranks.
        """
        for name in (fld.name for fld in dataclasses.fields(self)):
            v = getattr(self, name)
            if isinstance(v, (int, float)) and not (math.isfinite(v) and v >= 0):
                raise UserError(f"{where}: {name} must be a finite number >= 0, got {v!r}")
        if self.world_size < 1 or self.local_world_size < 1:
            raise UserError(f"{where}: world_size and local_world_size must be positive")
        if self.world_size > MAX_WORLD_SIZE:
            raise UserError(
                f"{where}: world_size {self.world_size:,} is more than {MAX_WORLD_SIZE:,} ranks"
            )
        if self.world_size % self.local_world_size:
            raise UserError(
                f"{where}: world_size {self.world_size} is not a multiple of "
                f"local_world_size {self.local_world_size}"
            )
        if self.device not in DEVICES:
            raise UserError(
                f"{where}: device must be one of {', '.join(DEVICES)}, got {self.device!r}"
            )
        if self.device == "cuda" and self.hbm_bytes <= 0:
            raise UserError(f"{where}: a cuda topology needs hbm_bytes > 0")
        for f in ("intra_host_bw", "inter_host_bw", "lookup_rate", "quant_rate", "dense_flops"):
            if getattr(self, f) <= 0:
                raise UserError(f"{where}: {f} must be positive")
        if not 0 <= self.pipeline_overlap <= 1 or not 0 <= self.memory_reserve_fraction < 1:
            raise UserError(
                f"{where}: pipeline_overlap must be in [0, 1] and memory_reserve_fraction in [0, 1)"
            )
        return self


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 64 * GiB


def _cpu_gloo(world_size: int, local_world_size: int) -> Topology:
    # Defaults for a small CPU host with gloo over shared memory; a profile's calibration replaces
    # the lookup and collective rates (coefficients.py). Where each figure comes from, and which are
    # assumed, is in benchmarks/README.md ("cpu-gloo preset").
    return Topology(
        world_size=world_size,
        local_world_size=local_world_size,
        device="cpu",
        preset="cpu-gloo",
        ddr_bytes=_host_memory_bytes() // local_world_size,
        memory_reserve_fraction=0.3,
        intra_host_bw=2e9,
        inter_host_bw=1.25e9,
        collective_latency_s=150e-6,
        lookup_rate=3e8,
        bwd_multiplier=3.0,
        kernel_latency_s=30e-6,
        quant_rate=3e8,
        pipeline_overlap=1.0,
        pipeline_overhead_s=1.5e-3,
        dense_flops=3e10,
    )


def _gpu_host(
    name: str, hbm: int, hbm_bw: float, world_size: int, local_world_size: int
) -> Topology:
    # 8 GPUs per host on NVLink/NVSwitch (~450 GB/s per direction, ~200 GB/s all-to-all effective),
    # 400 Gb/s NIC per GPU between hosts, 2 TiB host DDR per host, PCIe 5 UVM reads.
    # Lookups: the forward at 40 % of peak HBM bandwidth, the fused backward 2.5× the forward — 8.75
    # peak-bandwidth times a forward's bytes in all. The one public FBGEMM TBE training measurement
    # found (torchrec PR #4757, a production config: forward 64.7 % of peak, backward 26.5 % moving
    # twice the bytes, 4.9× the forward's time) comes to 9.1; TorchRec's estimator charges 3 (peak
    # bandwidth, backward 2×), so it weighs communication about 3× more against lookups than both.
    return Topology(
        world_size=world_size,
        local_world_size=local_world_size,
        device="cuda",
        preset=name,
        hbm_bytes=hbm,
        ddr_bytes=2048 * GiB // local_world_size,
        memory_reserve_fraction=0.15,
        intra_host_bw=200e9,
        inter_host_bw=40e9,
        collective_latency_s=25e-6,
        lookup_rate=hbm_bw / 4 * 0.4,
        bwd_multiplier=2.5,
        kernel_latency_s=8e-6,
        hbm_to_ddr_bw=32e9,
        quant_rate=2e11,
        pipeline_overlap=0.9,
        pipeline_overhead_s=15e-6,
        dense_flops=3e14,
    )


PRESETS = {
    "cpu-gloo": _cpu_gloo,
    "h100x8": lambda w, local: _gpu_host("h100x8", 80 * 10**9, 3.35e12, w, local),
    "h200x8": lambda w, local: _gpu_host("h200x8", 141 * 10**9, 4.8e12, w, local),
}
GPU_PRESETS = {"H100": "h100x8", "H200": "h200x8"}  # a profile's CUDA device name → its host preset


def profiled_topology(
    calibration: dict[str, Any] | None,
    where: str,
    world_size: int | None = None,
    local_world_size: int | None = None,
    device: str | None = None,
) -> Topology:
    """The preset `device`, else the one for the hardware a calibration's profile ran on, at the
    profile's ranks unless told.

    CPU profiles get cpu-gloo; CUDA profiles the preset of the GPU model the profile recorded. A GPU
    no preset describes is refused rather than planned for as if it were a CPU.
    """
    cal = calibration or {}
    ran = (cal.get("provenance") or {}).get("manifest") or {}
    world = world_size or int(cal.get("world_size") or 2)
    if device:
        return preset(device, world, local_world_size)
    if local_world_size is None and world == ran.get("world_size"):
        local_world_size = ran.get("local_world_size")
    if cal.get("device", "cpu") == "cpu":
        return preset("cpu-gloo", world, local_world_size)
    gpu = str(ran.get("gpu") or "")
    name = next((p for model, p in GPU_PRESETS.items() if model in gpu.upper()), None)
    if name is None:
        raise UserError(
            f"{where}: profiled on CUDA ({gpu or 'GPU model not recorded'}), which no preset "
            f"describes: say which with --device ({', '.join(GPU_PRESETS.values())}) "
            "or --topology FILE"
        )
    return preset(name, world, local_world_size)


def preset(name: str, world_size: int, local_world_size: int | None = None) -> Topology:
    """A named preset at `world_size` ranks (GPU presets: 8 ranks per host unless told)."""
    if name not in PRESETS:
        raise UserError(f"unknown device preset {name!r} (presets: {', '.join(PRESETS)})")
    if world_size < 1:
        raise UserError(f"--world-size must be positive, got {world_size}")
    if local_world_size is None:
        local_world_size = world_size if name == "cpu-gloo" else min(8, world_size)
    if local_world_size < 1 or world_size % local_world_size:
        raise UserError(
            f"--world-size {world_size} must be a multiple of --local-world-size {local_world_size}"
        )
    return PRESETS[name](world_size, local_world_size).validate(f"preset {name}")


def load_topology(path: str | Path) -> Topology:
    """Read a topology file; optional `base` names a preset whose values the file overrides."""
    where = str(path)
    d = read_versioned(path, FORMAT, VERSION, "topology file")
    fields = {f.name: f for f in dataclasses.fields(Topology)}
    unknown = sorted(set(d) - set(fields) - {"format", "version", "base"})
    if unknown:
        raise UserError(f"{where}: unknown keys {', '.join(unknown)}")
    if "world_size" not in d:
        raise UserError(f"{where}: missing key 'world_size'")
    values = {k: v for k, v in d.items() if k in fields}
    for k, v in values.items():
        if k == "preset":
            if v is not None and not isinstance(v, str):
                raise UserError(f"{where}: 'preset' must be a string or null, got {v!r}")
            continue
        want = str if k == "device" else (int if fields[k].type in ("int",) else (int, float))
        if isinstance(v, bool) or not isinstance(v, want):
            raise UserError(
                f"{where}: {k!r} must be {'a string' if want is str else 'a number'}, got {v!r}"
            )
    base = d.get("base")
    if base is not None:
        start = preset(base, values["world_size"], values.get("local_world_size"))
        return dataclasses.replace(start, **values).validate(where)
    values.setdefault("local_world_size", values["world_size"])
    if "device" not in values:
        raise UserError(f"{where}: missing key 'device' (or a 'base' preset)")
    return Topology(**values).validate(where)


def dense_step_estimate(spec: Any, topo: Topology, batch_size: int) -> float:
    """Dense MLPs' forward + backward seconds per step from their FLOPs (3 × 2·params·batch).

    Args:
        spec: a `sparselift.workloads.spec.WorkloadSpec` (its dense and over arches, its tables).
        topo: supplies the dense FLOP rate.
        batch_size: per rank.
    """
    m = spec.model
    dims = [spec.dense_in_features, *m.dense_arch]
    params = sum(a * b for a, b in zip(dims, dims[1:], strict=False))
    n = len(spec.tables) + 1
    over_in = m.dense_arch[-1] + (
        n * (n - 1) // 2 if m.interaction == "dot" else sum(t.embedding_dim for t in spec.tables)
    )
    over = [over_in, *m.over_arch]
    params += sum(a * b for a, b in zip(over, over[1:], strict=False))
    return 6.0 * params * batch_size / topo.dense_flops
