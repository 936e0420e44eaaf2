"""Write files so that readers never see half of one: a temp file in the same folder, then rename.

Every file a SparseLift command writes goes through `write_bytes`, so a path that cannot be written
is refused the same way everywhere: one line, "cannot write <path>: <why>" (UnwritablePathError, a
UserError: exit 2), and nothing left behind. `sparselift.plans` imports nothing of ours and keeps
its own copy of this logic (`plans/fileio.py`), with the same messages.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sparselift.errors import UnwritablePathError


def file_in_the_way(path: str | Path) -> Path | None:
    """The nearest existing ancestor of `path` if it is a file (nothing can be created below it)."""
    for folder in Path(path).parents:
        if folder.exists():
            return None if folder.is_dir() else folder
    return None


def unwritable_reason(path: str | Path) -> str | None:
    """Why a file cannot be created at `path`, found without touching the disk; None if it can.

    A missing folder is not created: a typo in `--out` should be refused, not become a tree.

    Returns:
        "it is a directory", "<folder> is not a directory" (the nearest existing ancestor is a
        file), "<folder> does not exist", or None.
    """
    path = Path(path)
    if path.is_dir():
        return "it is a directory"
    blocking = file_in_the_way(path)
    if blocking is not None:
        return f"{blocking} is not a directory"
    if not path.parent.is_dir():
        return f"{path.parent} does not exist"
    return None


def check_writable(path: str | Path) -> Path:
    """Refuse, before any work is done, a file path that `write_bytes` could not write.

    Commands that compute for a while call this on their output paths first. Beyond
    `unwritable_reason`, it creates (and at once removes) an empty temp file in the folder, as
    `write_bytes` will: a read-only or virtual file system (/proc) or a folder without write
    permission is refused now, not after the work, when other outputs may already be written.

    Returns:
        `path` as a Path.
    Raises:
        UnwritablePathError: "cannot write <path>: <why>".
    """
    path = _refuse_unwritable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
    except OSError as e:
        raise UnwritablePathError(f"cannot write {path}: {e.strerror or e}") from None
    os.close(fd)
    os.unlink(tmp)
    return path


def _refuse_unwritable(path: str | Path) -> Path:
    """`path` as a Path; UnwritablePathError where `unwritable_reason` gives a reason."""
    reason = unwritable_reason(path)
    if reason is not None:
        raise UnwritablePathError(f"cannot write {path}: {reason}")
    return Path(path)


def write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically, with the usual file mode (umask applied).

    Raises:
        UnwritablePathError: the path cannot be written ("cannot write <path>: <why>"); nothing
            is left behind.
    """
    path = _refuse_unwritable(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise UnwritablePathError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise UnwritablePathError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_bytes(obj: Any) -> bytes:
    """`obj` as the JSON files between stages are written: indent 1, key order kept, newline."""
    return (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode()


def parquet_bytes(df: Any) -> bytes:
    """A DataFrame as Parquet file bytes (built whole before anything is written)."""
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


def write_json(path: str | Path, obj: Any) -> None:
    """`write_bytes(path, json_bytes(obj))`; UnwritablePathError if the path cannot be written."""
    write_bytes(path, json_bytes(obj))
