"""Write files so that readers never see half of one: a temp file in the same folder, then rename."""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode()


def parquet_bytes(df: Any) -> bytes:
    """A DataFrame as Parquet file bytes (built whole before anything is written)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_json(path: str | Path, obj: Any) -> None:
    write_bytes(path, json_bytes(obj))
