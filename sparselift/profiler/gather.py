"""Collect one picklable object per rank on rank 0 (or pass it through when not distributed), and
every rank's files in rank 0's directory (`gather_files`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def barrier() -> None:
    """Wait for every rank of the default group (nothing without one, or alone)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def gather_to_rank0(obj: Any, group: Any = None) -> list[Any] | None:
    """Gather `obj` of every rank of `group` on its rank 0.

    Every rank must call this once, at the same point of its run.

    Returns:
        On rank 0 the objects in rank order; None on the other ranks; `[obj]` when not
        distributed (or a group of one).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return [obj]
    rank = dist.get_rank(group)
    out: list[Any] | None = [None] * dist.get_world_size(group) if rank == 0 else None
    dist.gather_object(
        obj, out, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group
    )
    return out


CHUNK_BYTES = 4 << 20  # read, compressed and sent at a time
DEFAULT_CAP_BYTES = 8 << 30  # per rank; SPARSELIFT_GATHER_CAP_BYTES overrides
_END, _ABORT = -1, -2


def gather_cap_bytes() -> int:
    """The most bytes of files one rank sends to rank 0 (SPARSELIFT_GATHER_CAP_BYTES)."""
    import os

    return int(os.environ.get("SPARSELIFT_GATHER_CAP_BYTES", DEFAULT_CAP_BYTES))


def gather_files(
    files: list[Path], out_dir: Path, cap_bytes: int | None = None
) -> dict[int, tuple[list[str], str | None]] | None:
    """Stream every rank's `files` into rank 0's `out_dir`, one rank after the other.

    Each file goes in CHUNK_BYTES pieces over the process group (point-to-point), each piece
    zlib-compressed unless the file is gzip already, so no rank needs a shared filesystem and
    rank 0 holds one piece at a time. A rank whose files add up to more than `cap_bytes` sends
    none. Rank 0 writes each file under a temp name and renames it once complete, so a file
    cut off is never left half-written. Every rank must call this once, at the same point.

    Args:
        files: this rank's files (rank 0's own are already in `out_dir`).
        out_dir: rank 0's directory.
        cap_bytes: per-rank limit (default `gather_cap_bytes()`).
    Returns:
        On every rank (rank 0 tells the others): per rank but 0, the names now in `out_dir` and
        why some are missing (None: none is); None when not distributed.
    """
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    cap = gather_cap_bytes() if cap_bytes is None else cap_bytes
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    sizes = [(f.name, f.stat().st_size) for f in files if f.exists()]
    total = sum(s for _, s in sizes)
    why = f"{total:,} bytes of files over the cap of {cap:,}" if total > cap else None
    listing = gather_to_rank0((sizes if why is None else [], why))
    out: dict[int, tuple[list[str], str | None]] = {}
    if rank == 0:
        assert listing is not None
        for r in range(1, world):
            names, reason = [], listing[r][1]
            for name, _ in listing[r][0]:
                failed = _receive(Path(out_dir, name), r, dev)
                if failed is None:
                    names.append(name)
                else:
                    reason = reason or failed
            out[r] = (names, reason)
    elif why is None:
        for f in files:
            if f.exists():
                _send(f, dev)
    box = [out]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _send(path: Path, dev: Any) -> None:
    """Send `path` to rank 0 piece by piece: a length, then the (compressed) bytes; then _END, or
    _ABORT if the file cannot be read to its end."""
    import zlib

    import torch
    import torch.distributed as dist

    packed = not path.name.endswith(".gz")
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(CHUNK_BYTES):
                data = zlib.compress(chunk, 1) if packed else chunk
                dist.send(torch.tensor([len(data)], dtype=torch.int64, device=dev), dst=0)
                buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
                dist.send(buf, dst=0)
        end = _END
    except OSError:
        end = _ABORT
    dist.send(torch.tensor([end], dtype=torch.int64, device=dev), dst=0)


def _receive(final: Path, src: int, dev: Any) -> str | None:
    """Receive one file from `src` into `final` (temp name, then rename).

    Every piece is received even when `final` cannot be written (the sender must not block).

    Returns:
        None when the file is complete in place; else why not (cut off, or an OSError).
    """
    import os
    import zlib

    import torch
    import torch.distributed as dist

    packed = not final.name.endswith(".gz")
    tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    why: str | None = None
    fh = None
    try:
        try:
            fh = open(tmp, "wb")
        except OSError as e:
            why = f"{type(e).__name__}: {e}"
        while True:
            n = torch.zeros(1, dtype=torch.int64, device=dev)
            dist.recv(n, src=src)
            size = int(n.item())
            if size < 0:
                if size != _END:
                    why = why or f"{final.name} was cut off (rank {src} could not read it)"
                break
            buf = torch.empty(size, dtype=torch.uint8, device=dev)
            dist.recv(buf, src=src)
            if fh is not None and why is None:
                data = buf.cpu().numpy().tobytes()
                try:
                    fh.write(zlib.decompress(data) if packed else data)
                except OSError as e:
                    why = f"{type(e).__name__}: {e}"
        if fh is not None:
            fh.close()
            fh = None
            if why is None:
                os.replace(tmp, final)
    finally:
        if fh is not None:
            fh.close()
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return why
