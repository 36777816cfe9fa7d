"""Files written whole or not at all: a checkpoint's pieces (each server's chunks, the
coordinator's manifest) must never be seen half-written, even after a crash."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: Path, parts: Iterable[bytes | memoryview]) -> None:
    """Write ``parts``, in order, to ``path`` atomically: into a temporary file beside it
    (a name starting with a dot), flushed to disk, then renamed over ``path`` and the
    rename flushed too. A reader sees the old file (or none) or the whole new one; a
    crash leaves at most a temporary file, never ``path`` partly written. Blocks for the
    write. Raises ``OSError`` (and then ``path`` is as it was)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    sync_dir(path.parent)


def sync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename in it) to disk. Blocks; raises ``OSError``."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
