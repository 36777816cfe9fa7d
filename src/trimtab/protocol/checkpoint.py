"""Checkpoint headers: CHECKPOINT (a tool asks for one), SNAPSHOT and SNAPSHOT_DONE (the
coordinator asks each server to write its chunks as of a clock, each answers), RESTORE
and RESTORED (a resumed job's servers load their chunks from a checkpoint).

Builders check nothing; readers check types and raise
``ProtocolError(ErrorCode.MALFORMED.value, ...)``. None blocks; all are thread-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from trimtab.errors import ProtocolError
from trimtab.protocol.messages import Control, ErrorCode, Header, WireHeader, fields

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_CHECKPOINT = int(Control.CHECKPOINT)
_SNAPSHOT = int(Control.SNAPSHOT)
_SNAPSHOT_DONE = int(Control.SNAPSHOT_DONE)
_RESTORE = int(Control.RESTORE)
_RESTORED = int(Control.RESTORED)
_OK = int(Control.OK)


class CheckpointHeader(WireHeader):
    """CHECKPOINT, tool -> coordinator: take a checkpoint at the next step boundary;
    answered OK ``path`` once it is complete (or ERROR)."""


def checkpoint() -> CheckpointHeader:
    return {"o": _CHECKPOINT}


class CheckpointReplyHeader(WireHeader):
    """OK answering CHECKPOINT."""

    path: str  # the complete checkpoint's directory
    k: int  # the clock it holds


def checkpoint_reply(*, rid: int, path: str, clock: int) -> CheckpointReplyHeader:
    return {"o": _OK, "i": rid, "path": path, "k": clock}


def read_checkpoint_reply(header: Header) -> CheckpointReplyHeader:
    fields(header, (("path", str), ("k", int)))
    return cast(CheckpointReplyHeader, header)


class SnapshotHeader(WireHeader):
    """SNAPSHOT, coordinator -> server: write every chunk it holds as of clock ``k``
    (once ``k`` rounds are applied, before any of round ``k`` is) into ``dir``, one file;
    answered SNAPSHOT_DONE. A newer SNAPSHOT replaces one not yet done."""

    n: int  # the checkpoint's number (this coordinator's count)
    k: int  # the clock
    dir: str  # the checkpoint's directory (the server writes one file there)


def snapshot(*, number: int, clock: int, directory: str) -> SnapshotHeader:
    return {"o": _SNAPSHOT, "n": number, "k": clock, "dir": directory}


def read_snapshot(header: Header) -> SnapshotHeader:
    fields(header, (("n", int), ("k", int), ("dir", str)))
    if header["k"] < 0:
        raise ProtocolError(ErrorCode.MALFORMED.value, "SNAPSHOT: clock 'k' is negative")
    return cast(SnapshotHeader, header)


class SnapshotDoneHeader(WireHeader):
    """SNAPSHOT_DONE, server -> coordinator: checkpoint ``n`` written (``file``, in its
    directory, holding ``c`` chunks), or not: a chunk was already past the clock
    (``late``: the highest round seen), or ``err`` says why."""

    n: int
    k: int
    file: NotRequired[str]
    c: NotRequired[int]
    sum: NotRequired[str]  # the file's checksum (runtime.files.CHECKSUM, hex), with file
    late: NotRequired[int]
    err: NotRequired[str]


def snapshot_done(
    *,
    number: int,
    clock: int,
    file: str | None = None,
    chunks: int = 0,
    digest: str | None = None,
    late: int | None = None,
    err: str | None = None,
) -> SnapshotDoneHeader:
    header: SnapshotDoneHeader = {"o": _SNAPSHOT_DONE, "n": number, "k": clock}
    if file is not None:
        header["file"] = file
        header["c"] = chunks
        if digest is not None:
            header["sum"] = digest
    if late is not None:
        header["late"] = late
    if err is not None:
        header["err"] = err
    return header


def read_snapshot_done(header: Header) -> SnapshotDoneHeader:
    """Checks every key's type, and that exactly one of ``file``, ``late``, ``err`` is
    given (``c`` with ``file``)."""
    fields(
        header,
        (("n", int), ("k", int)),
        (("file", str), ("c", int), ("sum", str), ("late", int), ("err", str)),
    )
    given = [key for key in ("file", "late", "err") if key in header]
    if len(given) != 1 or ("file" in header and "c" not in header):
        raise ProtocolError(
            ErrorCode.MALFORMED.value,
            "SNAPSHOT_DONE needs exactly one of 'file' (with 'c'), 'late' or 'err'",
        )
    return cast(SnapshotDoneHeader, header)


class RestoreHeader(WireHeader):
    """RESTORE, coordinator -> server, just before the first MAP of a resumed job: the
    chunks that MAP gives the server are loaded from these files of checkpoint ``dir``;
    RESTORED follows the MAP_ACK."""

    dir: str
    files: list[str]
    sums: NotRequired[dict[str, str]]  # file -> its checksum, as the manifest has it


def restore(
    *, directory: str, files: list[str], sums: dict[str, str] | None = None
) -> RestoreHeader:
    header: RestoreHeader = {"o": _RESTORE, "dir": directory, "files": files}
    if sums:
        header["sums"] = sums
    return header


def read_restore(header: Header) -> RestoreHeader:
    fields(header, (("dir", str), ("files", list)), (("sums", dict),))
    if not all(isinstance(f, str) for f in header["files"]):
        raise ProtocolError(ErrorCode.MALFORMED.value, "RESTORE: 'files' must be names")
    sums = header.get("sums", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in sums.items()):
        raise ProtocolError(ErrorCode.MALFORMED.value, "RESTORE: 'sums' must map names to sums")
    return cast(RestoreHeader, header)


class RestoredHeader(WireHeader):
    """RESTORED, server -> coordinator: ``n`` chunks loaded, or ``err`` why not."""

    n: NotRequired[int]
    err: NotRequired[str]


def restored(*, chunks: int = 0, err: str | None = None) -> RestoredHeader:
    if err is not None:
        return {"o": _RESTORED, "err": err}
    return {"o": _RESTORED, "n": chunks}


def read_restored(header: Header) -> RestoredHeader:
    fields(header, (), (("n", int), ("err", str)))
    if ("n" in header) == ("err" in header):
        raise ProtocolError(ErrorCode.MALFORMED.value, "RESTORED needs one of 'n' or 'err'")
    return cast(RestoredHeader, header)
