"""A job's checkpoint settings as the launcher passes them on: paths made absolute (the
coordinator and servers may run elsewhere in the tree), and the checkpoint to resume
from checked before anything starts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from trimtab.roles.coordinator.integrity import intact_checkpoint
from trimtab.settings import CheckpointSettings


def resolved(
    settings: CheckpointSettings, chunk_bytes: int, say: Callable[[str], None] = print
) -> CheckpointSettings:
    """``settings`` with absolute directories and the checkpoint to resume from checked:
    its manifest and every file's checksum
    (:func:`~trimtab.roles.coordinator.integrity.intact_checkpoint`; each checkpoint
    passed over for an older intact one is said through ``say``). Blocks to read the
    checkpoint. Raises :class:`ConfigError` if ``settings.resume`` names no intact
    complete checkpoint (saying why: none there, one never completed, one corrupt) or
    one cut into chunks of another size than ``chunk_bytes``."""
    resume = ""
    if settings.resume:
        found, skipped = intact_checkpoint(settings.resume, chunk_bytes)
        for line in skipped:
            say(f"--resume: {line}")
        resume = str(found)
    directory = str(Path(settings.directory).resolve()) if settings.directory else ""
    if resume and not directory:
        directory = str(Path(resume).parent)  # new checkpoints beside the resumed one
    return dataclasses.replace(settings, directory=directory, resume=resume)
