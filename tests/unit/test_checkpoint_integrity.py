"""A checkpoint's checksums (trimtab.roles.coordinator.integrity) on files made here:
the newest intact checkpoint is found, each passed over said; a manifest that lost its
checksums is refused, one written before them read unchecked. The refusals through
``trimtab run --resume``: tests/integration/test_checkpoints.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from trimtab.errors import ConfigError
from trimtab.roles.coordinator.integrity import intact_checkpoint
from trimtab.roles.coordinator.manifest import MANIFEST
from trimtab.runtime.files import seal, write_atomic


def _checkpoint(root: Path, clock: int, *, sums: bool = True) -> Path:
    directory = root / f"ckpt-{clock:08d}"
    directory.mkdir(parents=True)
    digest = write_atomic(directory / "server-0.chunks", [b"chunks of clock %d" % clock])
    manifest: dict[str, Any] = {
        "format": 1,
        "clock": clock,
        "files": ["server-0.chunks"],
        "tables": [],
        "map": {},
    }
    if sums:
        manifest = seal({**manifest, "sums": {"server-0.chunks": digest}})
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return directory


def test_the_newest_intact_checkpoint_is_taken_and_each_passed_over_said(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 4)
    middle = _checkpoint(tmp_path, 8)
    newest = _checkpoint(tmp_path, 12)
    assert intact_checkpoint(tmp_path, None) == (newest.resolve(), [])
    (newest / "server-0.chunks").write_bytes(b"chunks of clock 13")  # one digit: one bit off
    found, skipped = intact_checkpoint(tmp_path, None)
    assert found == middle.resolve()
    assert len(skipped) == 1 and "passed over ckpt-00000012" in skipped[0]
    (middle / "server-0.chunks").write_bytes(b"chunks")  # cut short
    found, skipped = intact_checkpoint(tmp_path, None)
    assert found.name == "ckpt-00000004" and len(skipped) == 2
    (found / "server-0.chunks").unlink()
    with pytest.raises(ConfigError, match="no intact checkpoint"):
        intact_checkpoint(tmp_path, None)


def test_a_manifest_that_lost_its_checksums_is_refused_one_from_before_them_is_read(
    tmp_path: Path,
) -> None:
    sealed = _checkpoint(tmp_path / "new", 4)
    manifest = json.loads((sealed / MANIFEST).read_text())
    del manifest["sums"]
    (sealed / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="does not match its checksum"):
        intact_checkpoint(sealed, None)
    legacy = _checkpoint(tmp_path / "old", 4, sums=False)
    assert intact_checkpoint(legacy, None) == (legacy.resolve(), [])


def test_temporaries_of_writers_that_are_gone_are_removed_a_live_one_s_stay(
    tmp_path: Path,
) -> None:
    import subprocess
    import sys

    from trimtab.runtime.files import remove_stale_temporaries

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead_pid = int(gone.stdout)
    ckpt = tmp_path / "ckpt-00000004"
    ckpt.mkdir()
    killed = [tmp_path / f".manifest.json.{dead_pid}.tmp", ckpt / f".server-0.bin.{dead_pid}.tmp"]
    live = ckpt / f".server-1.bin.{os.getpid()}.tmp"  # a writer still at work
    other = ckpt / ".notes.tmp"  # not write_atomic's: no pid
    for path in [*killed, live, other]:
        path.write_bytes(b"partial")
    write_atomic(ckpt / "server-2.bin", [b"whole"])  # leaves no temporary behind
    assert sorted(remove_stale_temporaries(tmp_path)) == sorted(killed)
    assert live.exists() and other.exists() and not any(p.exists() for p in killed)
    assert sorted(p.name for p in ckpt.iterdir()) == sorted([live.name, other.name, "server-2.bin"])
