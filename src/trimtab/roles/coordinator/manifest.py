"""A checkpoint on disk: its directory's name, finding the newest complete one, and its
manifest (the file written last, that makes the directory a checkpoint), read checked
and written atomically. What the coordinator does to take one or resume from one is in
:mod:`trimtab.roles.coordinator.checkpoint`; the servers' files in
:mod:`trimtab.roles.server.checkpoint`.

Every function here blocks for the file system; none is called from a loop that must
not wait but the coordinator's own, once per checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.runtime.files import write_atomic

__all__ = [
    "FORMAT",
    "MANIFEST",
    "checkpoint_dir",
    "discard",
    "find_checkpoint",
    "read_manifest",
    "write_manifest",
]

#: The file that makes a checkpoint's directory a complete checkpoint, written last.
MANIFEST = "manifest.json"

#: The manifest's format; one of another is refused.
FORMAT = 1


def checkpoint_dir(root: Path, clock: int) -> Path:
    """The directory of the checkpoint at ``clock`` under ``root``."""
    return root / f"ckpt-{clock:08d}"


def find_checkpoint(path: str | Path) -> Path:
    """The checkpoint ``path`` names: itself if it holds a manifest, else the newest
    complete checkpoint directory in it. Blocks for a directory listing. Raises
    :class:`ConfigError`, saying what is there: no such directory, checkpoints none of
    which is complete (no manifest: stopped while being written), or none at all."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"cannot resume from {path}: no such directory")
    if (p / MANIFEST).is_file():
        return p.resolve()
    found = sorted(d for d in p.glob("ckpt-*") if d.is_dir())
    complete = [d for d in found if (d / MANIFEST).is_file()]
    if complete:
        return complete[-1].resolve()
    if found or any(p.glob("server-*.chunks")):
        half = [d.name for d in found] or [p.name]
        raise ConfigError(
            f"cannot resume from {path}: {', '.join(half)} has no {MANIFEST}, so it is a "
            "checkpoint that was never completed (the job stopped while writing it); "
            "there is no complete checkpoint to resume from"
        )
    raise ConfigError(
        f"cannot resume from {path}: it holds no checkpoint (a directory with {MANIFEST}, "
        "as --checkpoint-every or `trimtab checkpoint` write)"
    )


def discard(directory: Path) -> None:
    """Remove the directory of a checkpoint attempt given up, unless it is complete
    (a manifest there: an earlier checkpoint at the same clock). Blocks; never raises."""
    if not (directory / MANIFEST).exists():
        shutil.rmtree(directory, ignore_errors=True)


def read_manifest(directory: Path, chunk_bytes: int | None = None) -> dict[str, Any]:
    """A checkpoint's manifest, checked: format, the keys resuming reads, every file it
    names present, and (if given) its chunks of ``chunk_bytes``, as the job resuming it
    cuts them. Blocks for the reads. Raises :class:`ConfigError`."""
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the checkpoint's manifest {path}: {exc}") from None
    kinds = {"format": int, "clock": int, "files": list, "tables": list, "map": dict}
    for key, kind in kinds.items():
        if not isinstance(manifest.get(key), kind):
            raise ConfigError(f"the checkpoint's manifest {path} has no valid {key!r}")
    if manifest["format"] != FORMAT:
        raise ConfigError(f"{path} is of checkpoint format {manifest['format']}, not {FORMAT}")
    missing = [f for f in manifest["files"] if not (directory / str(f)).is_file()]
    if missing:
        raise ConfigError(f"the checkpoint {directory} lacks its files {missing}")
    saved = manifest.get("chunk_bytes", chunk_bytes)
    if chunk_bytes is not None and saved != chunk_bytes:
        raise ConfigError(
            f"the checkpoint {directory} cut the tensors into chunks of {saved} bytes, this "
            f"job into {chunk_bytes}: resume it with --chunk-bytes {saved}"
        )
    return dict(manifest)


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` as ``directory``'s :data:`MANIFEST`, atomically (the directory
    is a complete checkpoint from then on). Blocks for the write; raises ``OSError``."""
    write_atomic(directory / MANIFEST, [json.dumps(manifest, indent=1).encode()])
