"""Files written whole or not at all: a checkpoint's pieces (each server's chunks, the
coordinator's manifest) must never be seen half-written, even after a crash."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trimtab.transport.hostid import process_running

#: The checksum of a checkpoint's files (``hashlib``'s name): written with each file,
#: checked before a job resumes from it.
CHECKSUM = "sha256"


def write_atomic(path: Path, parts: Iterable[bytes | memoryview]) -> str:
    """Write ``parts``, in order, to ``path`` atomically: into a temporary file beside it
    (a name starting with a dot), flushed to disk, then renamed over ``path`` and the
    rename flushed too. A reader sees the old file (or none) or the whole new one; a
    crash leaves at most a temporary file, never ``path`` partly written. Returns the
    :data:`CHECKSUM` of the bytes written (hex). Blocks for the write. Raises
    ``OSError`` (and then ``path`` is as it was)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    digest = hashlib.new(CHECKSUM)
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                digest.update(part)
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    sync_dir(path.parent)
    return digest.hexdigest()


def checksum_of(path: Path) -> str:
    """The :data:`CHECKSUM` of ``path``'s bytes (hex), read in pieces. Blocks for the
    read; raises ``OSError``."""
    digest = hashlib.new(CHECKSUM)
    with open(path, "rb") as f:
        while piece := f.read(1 << 22):
            digest.update(piece)
    return digest.hexdigest()


def sync_dir(directory: Path) -> None:
    """Flush a directory's entries (a rename in it) to disk. Blocks; raises ``OSError``."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _canonical(document: dict[str, Any]) -> bytes:
    body = {k: v for k, v in document.items() if k != "check"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal(document: dict[str, Any]) -> dict[str, Any]:
    """A JSON ``document`` (a checkpoint's manifest) with its ``check``: the
    :data:`CHECKSUM` (hex) of the rest, as canonical JSON. Never blocks."""
    return {**document, "check": hashlib.new(CHECKSUM, _canonical(document)).hexdigest()}


def sealed(document: dict[str, Any]) -> bool:
    """Whether ``document`` matches its ``check`` (:func:`seal`). Never blocks."""
    return document.get("check") == hashlib.new(CHECKSUM, _canonical(document)).hexdigest()


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Remove the temporary files :func:`write_atomic` left in ``root`` and the folders
    in it, one level down (a checkpoint directory and its checkpoints), by writers that
    are gone: a process killed mid-write (``.NAME.PID.tmp``, PID not running here).
    Those of a live process stay. Returns the files removed. Blocks for the directory
    reads; never raises (a file it cannot read or remove stays)."""
    removed: list[Path] = []
    try:
        folders = [root, *(d for d in root.iterdir() if d.is_dir())]
    except OSError:
        return removed
    for folder in folders:
        try:
            names = list(folder.glob(".*.tmp"))
        except OSError:
            continue
        for path in names:
            pid = path.name[: -len(".tmp")].rpartition(".")[2]
            if not pid.isdigit() or process_running(int(pid)):
                continue
            try:
                path.unlink()
            except OSError:
                continue
            removed.append(path)
    return removed
