"""A server's part of checkpoints: its chunks written as of a clock (SNAPSHOT), and a
resumed job's chunks loaded back (RESTORE, then the MAP that gives them out).

A checkpoint at clock ``k`` holds each chunk as it is once ``k`` rounds are applied and
before round ``k``'s update: what every worker reads at the start of its step ``k``.
Under BSP that is a consistent cut, the same for every chunk, taken without pausing: a
chunk at round ``k`` is taken at once (pushes of round ``k`` touch only its merge
buffer), one behind is taken the moment its round ``k - 1`` completes
(:attr:`ChunkStore.on_round`): taking is a copy, in the server's loop. Once every chunk
held is taken, a thread of its own writes them to one file of the checkpoint's
directory, atomically (a temporary file, then a rename), while the server goes on
serving; the loop says SNAPSHOT_DONE once it is written (:meth:`ServerCheckpoints.poll`).

A chunk's entry in the file is a STATE_SET header (value and optimizer state, the layout
:func:`~trimtab.roles.server.handover.encode_state` makes and
:func:`~trimtab.roles.server.state.load_state` takes) plus its version, round, counters
and consistency state; the frames follow the header, in order. File layout:
:data:`MAGIC`, the header's length (8 bytes, big-endian), the msgpack header
(``{"k": clock, "s": server, "chunks": [entry, ...]}``), the frames.

Not thread-safe: the server's loop owns it (the writing thread only writes the file
and hands its outcome back).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import logging
import mmap
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, ErrorCode, Header, error_of
from trimtab.roles.server.handover import encode_state
from trimtab.roles.server.state import load_state
from trimtab.roles.server.store import Chunk, ChunkStore
from trimtab.runtime.files import CHECKSUM, write_atomic
from trimtab.runtime.loop import NodeLoop
from trimtab.runtime.tensors import WIRE_DTYPES, as_bytes
from trimtab.transport import Frame, Peer

log = logging.getLogger("trimtab.server")

#: The first bytes of a server's checkpoint file (and its format's version).
MAGIC = b"TRIMTAB-CHUNKS-1\n"

#: A checkpoint file's header is refused past this size before it is decoded.
MAX_HEADER_BYTES = 256 << 20

#: The control ops :meth:`ServerCheckpoints.control` takes.
OPS = frozenset({Control.SNAPSHOT, Control.RESTORE})


def file_name(server: int) -> str:
    """The name of server ``server``'s file in a checkpoint's directory."""
    return f"server-{server}.chunks"


@dataclasses.dataclass
class _Pending:
    """A SNAPSHOT not yet written: the chunks taken so far and those still to take."""

    number: int
    clock: int
    directory: str
    left: set[int]
    taken: list[tuple[dict[str, Any], list[bytes]]] = dataclasses.field(default_factory=list)


def take(chunk: Chunk) -> tuple[dict[str, Any], list[bytes]]:
    """Chunk ``chunk``'s entry and frames (copies: the chunk trains on). Never blocks.
    Raises a BAD_STATE :class:`ProtocolError` in summation mode (the optimizer state
    lives on the workers there)."""
    if chunk.optimizer is None:
        raise ProtocolError(
            ErrorCode.BAD_STATE.value,
            "the job runs in summation mode, where the optimizer state lives on the "
            "workers: a checkpoint of the servers cannot resume it",
        )
    frames: list[Frame] = [as_bytes(chunk.value)]
    hp, meta = encode_state(chunk.optimizer, frames)
    entry = dict(
        headers.state_set(
            chunk=chunk.spec.id,
            epoch=0,
            state=meta,
            hp=hp,
            dtype=WIRE_DTYPES[chunk.value.dtype],
            numel=chunk.spec.numel,
        )
    )
    entry.update(
        v=chunk.version,
        k=chunk.round,
        p=[chunk.pushes, chunk.dropped, chunk.discounted],
        lc=sorted(chunk.last_clock.items()),
        lw=sorted(chunk.last_weight.items()),
        ls=chunk.last_sum,
        ad=chunk.adopted,
    )
    copies = [bytes(f) for f in frames]
    entry["sz"] = [len(c) for c in copies]
    return entry, copies


def write_file(
    path: Path, clock: int, server: int, chunks: list[tuple[dict[str, Any], list[bytes]]]
) -> str:
    """Write ``chunks`` (entries and frames) to ``path``, atomically
    (:func:`~trimtab.runtime.files.write_atomic`); return the file's checksum. Blocks
    for the write. Raises ``OSError``."""
    header = msgpack.packb(
        {"k": clock, "s": server, "chunks": [entry for entry, _ in chunks]}, use_bin_type=True
    )
    frames = (frame for _, fs in chunks for frame in fs)
    parts = itertools.chain([MAGIC, len(header).to_bytes(8, "big"), header], frames)
    return write_atomic(path, parts)


def read_file(
    path: Path, checksum: str | None = None
) -> dict[int, tuple[Header, list[memoryview]]]:
    """The chunks of a checkpoint file, by id: each entry and its frames, views of the
    file mapped into memory (privately: writing to them changes nothing on disk). With
    ``checksum`` (the manifest's), every byte is read once to check it first. Blocks
    for the reads. Raises ``OSError``, and a MALFORMED :class:`ProtocolError` for a
    file that is not one, truncated, whose entries do not match its bytes, or whose
    checksum is not ``checksum``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
    data = memoryview(mapped)

    def bad(why: str) -> ProtocolError:
        return ProtocolError(ErrorCode.MALFORMED.value, f"checkpoint file {path}: {why}")

    if checksum is not None and hashlib.new(CHECKSUM, data).hexdigest() != checksum:
        raise bad("its bytes do not match the manifest's checksum (changed or corrupt)")

    start = len(MAGIC) + 8
    if len(data) < start or bytes(data[: len(MAGIC)]) != MAGIC:
        raise bad("not a trimtab checkpoint file")
    size = int.from_bytes(data[len(MAGIC) : start], "big")
    if size > min(MAX_HEADER_BYTES, len(data) - start):
        raise bad(f"its header says {size} bytes, more than the file holds")
    try:
        header = msgpack.unpackb(data[start : start + size], raw=False, strict_map_key=False)
        entries = header["chunks"]
        assert isinstance(entries, list)
    except Exception as exc:  # msgpack raises several unrelated types
        raise bad(f"unreadable header ({type(exc).__name__})") from None
    out: dict[int, tuple[Header, list[memoryview]]] = {}
    at = start + size
    for entry in entries:
        sizes = entry.get("sz") if isinstance(entry, dict) else None
        cid = entry.get("c") if isinstance(entry, dict) else None
        if not isinstance(cid, int) or not isinstance(sizes, list):
            raise bad("an entry without its chunk id or frame sizes")
        frames = []
        for n in sizes:
            if not isinstance(n, int) or n < 0 or at + n > len(data):
                raise bad(f"chunk {cid}'s frames run past the end of the file (truncated?)")
            frames.append(data[at : at + n])
            at += n
        out[cid] = (entry, frames)
    if at != len(data):
        raise bad(f"{len(data) - at} bytes after the last chunk")
    return out


def restore_chunk(store: ChunkStore, entry: Header, frames: list[memoryview]) -> None:
    """Make the chunk ``entry`` names (held here, fresh) what the checkpoint holds:
    value and optimizer state (:func:`load_state`), version, round, counters. Raises as
    :func:`load_state`, and MALFORMED for a mistyped counter; nothing changed then but
    what load_state set."""
    try:
        version, round_, counts = int(entry["v"]), int(entry["k"]), [int(x) for x in entry["p"]]
        last_clock = {int(r): int(c) for r, c in entry["lc"]}
        last_weight = {int(r): float(w) for r, w in entry["lw"]}
        last_sum = float(entry["ls"])
        int(entry["ad"])  # (the stopped job's last adoption: read as ever, not applied)
        pushes, dropped, discounted = counts
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(
            ErrorCode.MALFORMED.value, f"chunk {entry.get('c')}: bad counters ({exc})"
        ) from None
    load_state(store, entry, frames)
    chunk = store.chunks[entry["c"]]
    chunk.version, chunk.round = version, round_
    chunk.pushes, chunk.dropped, chunk.discounted = pushes, dropped, discounted
    chunk.last_clock, chunk.last_weight = last_clock, last_weight
    chunk.last_sum = last_sum
    # The stopped job's adoption numbers are not this job's: its coordinator numbers its
    # adoptions from 1 again, and a grant of the stopped job does not verify here (the
    # job id is in it). Kept, the first broadcast of a resumed job was refused.
    chunk.adopted = 0
    chunk.seeded = True  # no INIT may overwrite it


class ServerCheckpoints:
    """One server's SNAPSHOTs and its RESTORE over its ``store``; what it says to the
    coordinator (``coordinator`` of ``loop``) it sends itself. Not thread-safe: the
    server's loop owns it and calls :meth:`poll` every turn; nothing here blocks but
    reading a checkpoint file (RESTORE)."""

    def __init__(self, store: ChunkStore, loop: NodeLoop, coordinator: Peer) -> None:
        self._store = store
        self._send: Callable[[Any], None] = lambda header: loop.send(coordinator, header)
        self._wake = loop.transport.wake
        # What writing threads hand back (appended there, taken here: a list's append
        # and pop are atomic), and those threads, for :meth:`close`.
        self._written: list[headers.SnapshotDoneHeader] = []
        self._writers: list[threading.Thread] = []
        self._pending: _Pending | None = None
        self._restoring: dict[int, tuple[Header, list[memoryview]]] | None = None
        self._restore_error: str | None = None
        store.on_round = self._on_round

    def control(self, header: Header) -> None:
        """Take a SNAPSHOT or RESTORE (decoded). Raises a reader's MALFORMED
        :class:`ProtocolError`."""
        if header["o"] == Control.SNAPSHOT:
            msg = headers.read_snapshot(header)
            if self._pending is not None:
                log.info("server %d: checkpoint %d replaced", self._store.index, msg["n"])
            self._pending = _Pending(msg["n"], msg["k"], msg["dir"], set(self._store.chunks))
            for chunk in list(self._store.chunks.values()):
                self._on_round(chunk)
            if self._pending is not None and not self._pending.left:
                self._write()
            return
        msg_r = headers.read_restore(header)
        self._restoring, self._restore_error = {}, None
        try:
            for name in msg_r["files"]:
                if "/" in name or name.startswith("."):
                    raise ProtocolError(ErrorCode.MALFORMED.value, f"bad file name {name!r}")
                path = Path(msg_r["dir"]) / name
                self._restoring.update(read_file(path, msg_r.get("sums", {}).get(name)))
        except (OSError, ProtocolError) as exc:
            why = error_of(exc)[1] if isinstance(exc, ProtocolError) else str(exc)
            self._restore_error = f"server {self._store.index} cannot read the checkpoint: {why}"

    def mapped(self) -> None:
        """The first MAP was applied: if a RESTORE came before it, load the chunks it
        gave this server from the checkpoint and say RESTORED (or why not)."""
        if self._restoring is None:
            return
        loaded, stash, self._restoring = 0, self._restoring, None
        err = self._restore_error
        for cid in sorted(self._store.chunks) if err is None else ():
            if cid not in stash:
                err = f"chunk {cid} is in none of the checkpoint's files"
                break
            try:
                restore_chunk(self._store, *stash[cid])
            except ProtocolError as exc:
                err = f"chunk {cid}: {error_of(exc)[1]}"
                break
            loaded += 1
        if err is not None:
            log.error("server %d: resuming failed: %s", self._store.index, err)
        self._send(headers.restored(chunks=loaded, err=err))

    def _on_round(self, chunk: Chunk) -> None:
        """Take ``chunk`` if a checkpoint waits for it at its round; once every chunk is
        taken, write the file."""
        p = self._pending
        cid = chunk.spec.id
        if p is None or cid not in p.left or chunk.round < p.clock:
            return
        if chunk.round > p.clock:  # (only when the SNAPSHOT came: rounds go one by one)
            self._pending = None
            self._send(headers.snapshot_done(number=p.number, clock=p.clock, late=chunk.round))
            return
        try:
            p.taken.append(take(chunk))
        except ProtocolError as exc:
            self._pending = None
            err = error_of(exc)[1]
            self._send(headers.snapshot_done(number=p.number, clock=p.clock, err=err))
            return
        p.left.discard(cid)
        if not p.left:
            self._write()

    def poll(self) -> None:
        """Say SNAPSHOT_DONE for each file written since the last call. Never blocks."""
        while self._written:
            self._send(self._written.pop(0))
        if self._writers:  # (the loop calls this every turn: nothing else, mostly)
            self._writers = [t for t in self._writers if t.is_alive()]

    def close(self, timeout_s: float = 30.0) -> None:
        """Wait up to ``timeout_s`` for files still being written (the server stops).
        Blocks."""
        for thread in self._writers:
            thread.join(timeout_s)

    def _write(self) -> None:
        p = self._pending
        assert p is not None
        self._pending = None
        thread = threading.Thread(
            target=self._write_file, args=(p, self._store.index), name="trimtab-checkpoint"
        )
        thread.daemon = True
        self._writers.append(thread)
        thread.start()

    def _write_file(self, p: _Pending, index: int) -> None:
        """(In a thread of its own.) Write ``p``'s chunks, then hand back the answer."""
        name = file_name(index)
        try:
            # The coordinator made the directory; one gone since was given up (a
            # server made it again then, and left it behind): not written into.
            if not Path(p.directory).is_dir():
                raise FileNotFoundError(f"{p.directory} is gone (the checkpoint was given up)")
            digest = write_file(Path(p.directory) / name, p.clock, index, p.taken)
        except OSError as exc:
            err = f"server {index} cannot write {p.directory}/{name}: {exc}"
            self._written.append(headers.snapshot_done(number=p.number, clock=p.clock, err=err))
        else:
            log.info("server %d: %d chunks written for clock %d", index, len(p.taken), p.clock)
            done = headers.snapshot_done(
                number=p.number, clock=p.clock, file=name, chunks=len(p.taken), digest=digest
            )
            self._written.append(done)
        self._wake()
