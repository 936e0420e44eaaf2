"""What a calibration's collectives say about the wire the cost model prices: whether every byte
crossed hosts (its per-byte fits are then the inter-host cost), and the quantize cost a measured
16-bit net implies for the bytes the wire model still prices."""

from __future__ import annotations

from sparselift.calibration import RS_KIND, Calibration
from sparselift.kernels import FLOAT_BYTES

# the collectives whose per-byte fits are wire time
DIST_KINDS = ("input_dist", *RS_KIND, *RS_KIND.values())


def every_byte_crossed_hosts(cal: Calibration) -> bool:
    """Whether every collective byte of the calibrated profile crossed hosts: several hosts of
    one rank each (the manifest's world_size and local_world_size), so its distributions'
    per-byte fits are the inter-host cost."""
    m = cal.provenance.manifest
    world, local = m.get("world_size"), m.get("local_world_size")
    return isinstance(world, int) and local == 1 and world > 1


def quantize_from_net(net_s: float, out_b_s: float, wire_b_s: float) -> float:
    """The quantize seconds per element a measured 16-bit cost implies, for the bytes the wire
    model still prices (those that cross hosts; inside the host the net is priced as measured,
    `Coefficients.qcomm_net_s`).

    The wire model prices B fp32 bytes of pooled embeddings at 16 bits as
    b·B − ½·min(b, wire)·B + 2·quantize·B/4 (half the bytes leave the wire; quantize at the
    sender, dequantize at the receiver); a profile measured b·B + net·B/4
    (`analysis.precision_fit`). The two agree when quantize = net/2 + ½·min(b, wire)·4/2. Never
    negative: a saving beyond the wire time the model knows of is not counted on.

    Args:
        net_s: the measured net seconds per element at 16 bits over fp32.
        out_b_s: the measured fp32 output distribution's seconds per byte.
        wire_b_s: the topology's seconds per byte on the wire.
    """
    return max(0.0, net_s / 2.0 + 0.5 * min(out_b_s, wire_b_s) * FLOAT_BYTES / 2.0)
