"""Checkpoints that cannot lie: each file's checksum in the manifest, the manifest sealed
by its own, and the newest intact checkpoint found before a job resumes.

A server answers SNAPSHOT_DONE with its file's checksum (taken as it wrote the file,
:func:`~trimtab.runtime.files.write_atomic`); the coordinator writes them into the
manifest (``sums``: file -> hex) and seals the manifest (``check``: the checksum of the
manifest's canonical JSON without ``check``). Before anything of a resumed job starts,
the launcher reads the manifest, checks its seal and every file's checksum
(:func:`intact_checkpoint`): one flipped bit, a truncated file or a broken manifest is
found there, not by a server once every process has started. Given a directory of
checkpoints, a newest one that fails is passed over for the newest intact one, and each
passed over is said; given one checkpoint, it is refused, naming the older ones.

A manifest written before checksums (no ``sums``) is read as before, unchecked.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.roles.coordinator.manifest import MANIFEST, find_checkpoint, read_manifest
from trimtab.runtime.files import checksum_of, sealed


def verify(directory: Path, manifest: dict[str, Any]) -> None:
    """Check a checkpoint's manifest (read from ``directory``) against its seal and
    every file it names against its checksum. Blocks to read every file. Raises
    :class:`ConfigError` naming what differs (the manifest, or each file that is
    corrupt, truncated or replaced since it was written)."""
    sums = manifest.get("sums")
    if sums is None and "check" not in manifest:
        return  # written before checksums
    if not sealed(manifest):
        raise ConfigError(
            f"the checkpoint's manifest {directory / MANIFEST} does not match its checksum: "
            "it was changed or corrupted since it was written"
        )
    if not isinstance(sums, dict) or set(sums) != set(map(str, manifest["files"])):
        raise ConfigError(f"the checkpoint's manifest {directory / MANIFEST} has no valid 'sums'")
    bad = []
    for name, want in sorted(sums.items()):
        try:
            got = checksum_of(directory / name)
        except OSError as exc:
            bad.append(f"{name} ({exc})")
            continue
        if got != want:
            size = (directory / name).stat().st_size
            bad.append(f"{name} ({size} bytes: corrupt, truncated or replaced)")
    if bad:
        raise ConfigError(f"the checkpoint {directory} fails its checksums: {', '.join(bad)}")


def intact_checkpoint(path: str | Path, chunk_bytes: int | None) -> tuple[Path, list[str]]:
    """The checkpoint to resume from, checked (:func:`read_manifest` and :func:`verify`),
    and what was passed over, one line each. ``path`` is one checkpoint (refused if it
    fails, naming the complete ones beside it) or a directory of them (its newest that
    passes). Blocks to read every file of the checkpoints tried. Raises
    :class:`ConfigError` saying why, for each tried."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        manifest = read_manifest(p, chunk_bytes)
        try:
            verify(p.resolve(), manifest)
        except ConfigError as exc:
            older = sorted(d.name for d in p.resolve().parent.glob("ckpt-*") if d != p.resolve())
            hint = f"; the others beside it: {', '.join(older)}" if older else ""
            raise ConfigError(f"{exc}: pass --resume DIR/ckpt-N to choose one{hint}") from None
        return p.resolve(), []
    find_checkpoint(p)  # no complete one: its own words
    complete = sorted((d for d in p.glob("ckpt-*") if (d / MANIFEST).is_file()), reverse=True)
    skipped: list[str] = []
    for candidate in complete:
        try:
            verify(candidate.resolve(), read_manifest(candidate, chunk_bytes))
        except ConfigError as exc:
            skipped.append(f"passed over {candidate.name}: {exc}")
            continue
        return candidate.resolve(), skipped
    raise ConfigError(f"cannot resume from {path}: no intact checkpoint; " + "; ".join(skipped))
