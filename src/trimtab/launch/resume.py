"""A job's checkpoint settings as the launcher passes them on: paths made absolute (the
coordinator and servers may run elsewhere in the tree), and the checkpoint to resume
from checked before anything starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trimtab.roles.coordinator.checkpoint import find_checkpoint, read_manifest
from trimtab.settings import CheckpointSettings


def resolved(settings: CheckpointSettings, chunk_bytes: int) -> CheckpointSettings:
    """``settings`` with absolute directories. Blocks to read the resumed checkpoint's
    manifest. Raises :class:`ConfigError` if ``settings.resume`` names no complete
    checkpoint (saying why: none there, or one never completed) or one cut into chunks
    of another size than ``chunk_bytes``."""
    resume = ""
    if settings.resume:
        found = find_checkpoint(settings.resume)
        read_manifest(found, chunk_bytes)
        resume = str(found)
    directory = str(Path(settings.directory).resolve()) if settings.directory else ""
    if resume and not directory:
        directory = str(Path(resume).parent)  # new checkpoints beside the resumed one
    return dataclasses.replace(settings, directory=directory, resume=resume)
