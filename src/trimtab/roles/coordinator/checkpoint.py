"""Checkpoints at the coordinator: when to take one, the servers' parts, the manifest
that completes it, and a job resumed from one.

Taking one (``--checkpoint-every N``, or CHECKPOINT from ``trimtab checkpoint``): the
coordinator picks a clock ``k`` a little ahead of the furthest step any worker reported
(:data:`MARGIN`), so that no chunk is past it yet, and sends every live server SNAPSHOT.
Each writes the chunks it holds as of ``k`` (see :mod:`trimtab.roles.server.checkpoint`)
into the checkpoint's directory, one file each, in parallel, and answers SNAPSHOT_DONE.
A server that already had a chunk past ``k`` says so (``late``), and the checkpoint is
asked again at a later clock (further ahead at each try: control messages can lag the
data path by several steps on a busy machine), under a new number; the directory of an
attempt given up is removed, as is that of one the job's end overtook. Once every
server wrote its file and the files hold every chunk once, the coordinator writes
:data:`MANIFEST` last, atomically: only a directory with a manifest is a checkpoint.
Training never pauses for it (step-boundary migrations wait); a server copies its
chunks in its loop and writes them in a thread of its own.

The manifest (JSON) holds the clock, the files, the tables (tensors and optimizer of
each DistributedOptimizer), the placement map (``PlacementMap.to_dict``) and the step
state (``Steps.to_dict``: clocks and the batch-sizing history), each as its owner's
dict, so a field added there travels without this module changing.

Resuming (``--resume DIR``): the newest complete checkpoint in ``DIR`` is read before
anything starts (a directory without a manifest is refused, saying so). Once every
server and worker registered, each server is sent RESTORE (the files), then the
checkpoint's map (MAP); it loads the chunks that map gives it and says RESTORED. The
workers' DECLAREs are held until every server did, then answered as the declaration of a
table the job has (``Maps.again``), with the checkpoint's clock: their optimizers start
there (``DistributedOptimizer.clock``, ``trimtab.start_step()``) and pull the values.

Not thread-safe: the coordinator's loop owns it. Nothing here blocks but reading the
manifest (at construction) and writing it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError, ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import Control, ErrorCode, Header, error_of
from trimtab.roles.coordinator.config import CoordinatorConfig
from trimtab.roles.coordinator.manifest import (
    FORMAT,
    MANIFEST,
    checkpoint_dir,
    discard,
    find_checkpoint,
    read_manifest,
    write_manifest,
)
from trimtab.roles.coordinator.maps import Maps
from trimtab.roles.coordinator.members import Member, Members, MemberState, Role
from trimtab.roles.coordinator.outbox import Outbox, Refuse, Send
from trimtab.roles.coordinator.rebalance import Rebalancer
from trimtab.roles.coordinator.steps import Steps
from trimtab.runtime.files import remove_stale_temporaries, seal
from trimtab.settings import DEFAULT_CHECKPOINT_DIR
from trimtab.transport.base import Peer

log = logging.getLogger("trimtab.coordinator")

#: The coordinator's exit status for a job that ran to its end while its last
#: checkpoint failed: the launcher lets the workers finish, then ends with status 1.
CHECKPOINT_FAILED_STATUS = 3

#: A checkpoint is asked at this many clocks past the furthest step reported: far enough
#: that no chunk is past it yet, near enough that it comes within a few steps. Each
#: try asks twice as far ahead as the one before.
MARGIN = 2

#: Times a checkpoint is asked again at a later clock before it is given up.
RETRIES = 10

#: A checkpoint not complete this many steps past its clock is asked again (a chunk
#: that moved meanwhile is waited for nowhere).
STALL_STEPS = 10

#: Tools' CHECKPOINT requests waiting at most (more are refused).
MAX_WAITING = 64

#: A member op handler, as the coordinator's: (member, header, frames, outbox).
Handler = Callable[[Member, Header, list[memoryview], Outbox], None]
#: An op anyone may send, as the coordinator's: (peer, header, outbox).
Opener = Callable[[Peer, Header, Outbox], None]


@dataclasses.dataclass
class _Taking:
    """A checkpoint in progress: its number, clock and directory, the servers still to
    answer, the files written, the chunks they hold, the tries so far, and the tools
    waiting for it (peer, request id)."""

    number: int
    clock: int
    directory: Path
    waiting: set[int]
    files: list[str] = dataclasses.field(default_factory=list)
    sums: dict[str, str] = dataclasses.field(default_factory=dict)  # file -> checksum
    chunks: int = 0
    tries: int = 0
    askers: list[tuple[Peer, int]] = dataclasses.field(default_factory=list)


class Checkpoints:
    """A job's checkpoints, and its resumption from one, over the coordinator's pieces.

    Construction reads the checkpoint to resume from, if ``config.checkpoint.resume``
    names one (blocks for the read; raises :class:`ConfigError` if it is not complete,
    or for checkpoint settings in a job that is not bsp).
    :meth:`register` installs its ops in the coordinator's tables.

    Attributes:
        root: the directory new checkpoints go into.
        last_checkpoint: the newest complete checkpoint's directory (the one resumed
            from, at first), or None.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        members: Members,
        maps: Maps,
        steps: Steps,
    ) -> None:
        settings = config.checkpoint
        self._synchronous = config.settings().consistency.synchronous
        if (settings.every or settings.resume) and not self._synchronous:
            raise ConfigError(
                f"checkpoints are a consistent cut (one clock for every chunk) only under "
                f"--mode bsp, not {config.consistency}: drop --checkpoint-every and --resume"
            )
        self._job = config.job
        self._chunk_bytes = config.chunk_bytes
        self._every = settings.every
        self._members, self._maps, self._steps = members, maps, steps
        self._rebalancer: Rebalancer | None = None
        self._abort: Callable[[str], None] = lambda why: None
        self._number = 0
        self._taking: _Taking | None = None
        self._max_failures = settings.max_failures
        #: Checkpoints failed in a row, and why the last did (None once one succeeds).
        self.failures = 0
        self.failing: str | None = None
        self._manifest: dict[str, Any] | None = None
        self.last_checkpoint: str | None = None
        # A resumed job's DECLAREs, held until every server loaded its chunks (then
        # None), and the servers still loading.
        self._held: list[tuple[Member, Header]] | None = None
        self._loading: set[int] | None = None
        self._declare: Handler | None = None
        self._wanted: list[tuple[Peer, int]] = []  # tools waiting for one to start
        root = settings.directory
        if settings.resume:
            found = find_checkpoint(settings.resume)
            self._manifest = read_manifest(found, config.chunk_bytes)
            self.last_checkpoint = str(found)
            self._held = []
            steps.restore(self._manifest.get("steps", {}), self._manifest["clock"])
            root = root or str(found.parent)  # (where the resumed-from one is)
            log.info("resuming from %s at clock %d", found, self._manifest["clock"])
        self.root = Path(root or DEFAULT_CHECKPOINT_DIR).resolve()
        self._due = self.resume_clock + self._every
        if self._every or settings.resume:
            # What a process killed mid-write left (this job's earlier run, say).
            for path in remove_stale_temporaries(self.root):
                log.info("removed %s: a temporary file of a writer that is gone", path)

    @property
    def resume_clock(self) -> int:
        """The clock the job resumed from (0 for a fresh job)."""
        return int(self._manifest["clock"]) if self._manifest else 0

    def register(
        self,
        open_ops: dict[int, Opener],
        handlers: dict[int, tuple[Handler, frozenset[Role]]],
        rebalancer: Rebalancer,
        abort: Callable[[str], None],
    ) -> None:
        """Install CHECKPOINT among the ops anyone may send, SNAPSHOT_DONE and RESTORED
        among the servers', and wrap the coordinator's REGISTER (a resumed job's map
        goes out once every member registered), DECLARE (held while resuming) and
        REPORT (a checkpoint is due at a step boundary) handlers. No checkpoint starts
        while ``rebalancer`` migrates; ``abort`` ends the job (a server that cannot load
        its chunks)."""
        self._rebalancer, self._abort = rebalancer, abort
        rebalancer.paused = lambda: self._taking is not None
        servers = frozenset({Role.SERVER})
        open_ops[Control.CHECKPOINT] = self._on_checkpoint
        handlers[Control.SNAPSHOT_DONE] = (self._on_snapshot_done, servers)
        handlers[Control.RESTORED] = (self._on_restored, servers)
        register = open_ops[Control.REGISTER]

        def on_register(peer: Peer, header: Header, out: Outbox) -> None:
            register(peer, header, out)
            self._everyone_joined(out)

        open_ops[Control.REGISTER] = on_register
        done, roles = handlers[Control.DONE]

        def on_done(m: Member, header: Header, frames: list[memoryview], out: Outbox) -> None:
            done(m, header, frames, out)
            ended = all(w.state is MemberState.DONE for w in self._members.workers.values())
            if ended and self._taking is not None:
                self._fail("the job ended before every chunk reached its clock", out)

        handlers[Control.DONE] = (on_done, roles)
        declare, roles = handlers[Control.DECLARE]
        self._declare = declare

        def on_declare(m: Member, header: Header, frames: list[memoryview], out: Outbox) -> None:
            if self._held is None:
                declare(m, header, frames, out)
            else:
                self._held.append((m, header))

        handlers[Control.DECLARE] = (on_declare, roles)
        report, roles = handlers[Control.REPORT]

        def on_report(m: Member, header: Header, frames: list[memoryview], out: Outbox) -> None:
            report(m, header, frames, out)
            self._boundary(out)

        handlers[Control.REPORT] = (on_report, roles)

    # -- resuming ---------------------------------------------------------------------

    def _everyone_joined(self, out: Outbox) -> None:
        """Once every server and worker registered, a resumed job's servers get RESTORE
        and the checkpoint's map."""
        m = self._manifest
        members = self._members
        if (
            m is None
            or self._loading is not None
            or len(members.servers) < members.num_servers
            or len(members.workers) < members.num_workers
        ):
            return
        self._loading = {s.rank for s in members.servers}
        directory = str(self.last_checkpoint)
        sums = m.get("sums")  # (the servers check each file as they read it)
        restore = headers.restore(
            directory=directory,
            files=[str(f) for f in m["files"]],
            sums=dict(sums) if isinstance(sums, dict) else None,
        )
        out += [Send(s.peer, restore) for s in members.servers]
        tables = [(list(t), dict(o)) for t, o in m["tables"]]
        out += self._maps.restore(tables, m["map"], members)

    def _on_restored(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        msg = headers.read_restored(header)
        if self._loading is None or member.rank not in self._loading:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "RESTORED, but no RESTORE was sent")
        if "err" in msg:
            self._abort(f"cannot resume from {self.last_checkpoint}: {msg['err']}")
            return
        self._loading.discard(member.rank)
        if self._loading or self._held is None:
            return
        held, self._held = self._held, None
        log.info(
            "every server loaded the checkpoint; workers go on from clock %d", self.resume_clock
        )
        assert self._declare is not None
        for worker, declared in held:
            try:
                self._declare(worker, declared, [], out)
            except ProtocolError as exc:
                code, why = error_of(exc)
                out.append(Refuse(worker.peer, declared["i"], code, why))

    # -- taking -----------------------------------------------------------------------

    def _on_checkpoint(self, peer: Peer, header: Header, out: Outbox) -> None:
        """A tool's CHECKPOINT: answered once the checkpoint in progress, or one started
        now (at the first step report, before training started), is complete."""
        if not self._synchronous:
            raise ProtocolError(
                ErrorCode.BAD_STATE.value, "checkpoints are taken only under --mode bsp"
            )
        if len(self._wanted) >= MAX_WAITING:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "too many checkpoints asked at once")
        self._wanted.append((peer, header["i"]))
        if self._taking is not None:
            self._taking.askers += self._wanted
            self._wanted = []
        elif self._maps.map is not None and self._held is None:
            self._start(self._next_clock(), out)

    def _next_clock(self) -> int:
        return max(self._steps.clocks.values(), default=0) + MARGIN

    def _boundary(self, out: Outbox) -> None:
        """After a step report: start a checkpoint that is due, ask a stalled one again."""
        taking = self._taking
        if taking is not None:
            if self._steps.job_clock > taking.clock + STALL_STEPS:
                self._retry(taking, self._next_clock(), "it stalled", out)
            return
        if self._wanted and self._maps.map is not None and self._held is None:
            self._start(self._next_clock(), out)
        elif (
            self._every
            and self._maps.map is not None
            and self._next_clock() >= self._due
            and (self._rebalancer is None or self._rebalancer.migrating is None)
        ):
            self._start(max(self._due, self._next_clock()), out)

    def _start(self, clock: int, out: Outbox, tries: int = 0) -> None:
        """Ask every live server for its chunks as of ``clock``."""
        self._number += 1
        directory = checkpoint_dir(self.root, clock)
        askers = (self._taking.askers if self._taking else []) + self._wanted
        self._wanted = []
        servers = [m for m in self._members.servers if not m.finished]
        try:  # (the servers write into it; one given up since is not made again)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / MANIFEST).unlink(missing_ok=True)  # incomplete while rewritten
        except OSError as exc:
            self._taking = _Taking(self._number, clock, directory, set(), askers=askers)
            self._fail(f"cannot write into {directory}: {exc}", out)
            return
        self._taking = _Taking(
            self._number, clock, directory, {m.rank for m in servers}, tries=tries, askers=askers
        )
        snapshot = headers.snapshot(number=self._number, clock=clock, directory=str(directory))
        out += [Send(m.peer, snapshot) for m in servers]
        log.info("checkpoint %d: at clock %d into %s", self._number, clock, directory)

    def _retry(self, taking: _Taking, clock: int, why: str, out: Outbox) -> None:
        discard(taking.directory)
        if taking.tries >= RETRIES:
            self._fail(f"{why}, {RETRIES} times", out)
            return
        log.info(
            "checkpoint %d at clock %d: %s; asking at clock %d",
            taking.number,
            taking.clock,
            why,
            clock,
        )
        self._start(clock, out, taking.tries + 1)

    def _fail(self, why: str, out: Outbox) -> None:
        taking = self._taking
        assert taking is not None
        self._taking = None
        discard(taking.directory)
        self._due = max(self._due, taking.clock) + self._every
        log.error("checkpoint at clock %d failed: %s", taking.clock, why)
        for peer, rid in taking.askers:
            out.append(Refuse(peer, rid, ErrorCode.BAD_STATE.value, f"checkpoint failed: {why}"))
        self.failures += 1
        self.failing = f"the checkpoint at clock {taking.clock} failed: {why}"
        if self._max_failures and self.failures >= self._max_failures:
            self._abort(
                f"{self.failures} checkpoints in a row failed, the last at clock "
                f"{taking.clock}: {why} (--checkpoint-failures {self._max_failures})"
            )

    def _on_snapshot_done(
        self, member: Member, header: Header, _: list[memoryview], out: Outbox
    ) -> None:
        done = headers.read_snapshot_done(header)
        taking = self._taking
        if taking is None or done["n"] != taking.number or member.rank not in taking.waiting:
            return  # an answer to a checkpoint asked again since: moot
        if "late" in done:
            ahead = MARGIN << (taking.tries + 1)
            self._retry(taking, done["late"] + ahead, f"server {member.rank} was past it", out)
            return
        if "err" in done:
            self._fail(done["err"], out)
            return
        taking.waiting.discard(member.rank)
        taking.files.append(done["file"])
        if "sum" in done:
            taking.sums[done["file"]] = done["sum"]
        taking.chunks += done["c"]
        if taking.waiting:
            return
        if taking.chunks != len(self._maps.sizes):
            why = f"the servers wrote {taking.chunks} chunks of {len(self._maps.sizes)}"
            self._retry(taking, self._next_clock(), why, out)
            return
        try:
            self._write_manifest(taking)
        except (OSError, TypeError, ValueError) as exc:
            self._fail(f"cannot write its manifest: {exc}", out)
            return
        self._taking = None
        self._due = taking.clock + self._every
        self.last_checkpoint = str(taking.directory)
        self.failures, self.failing = 0, None
        log.info("checkpoint at clock %d complete: %s", taking.clock, taking.directory)
        path = str(taking.directory)
        out += [
            Send(p, headers.checkpoint_reply(rid=r, path=path, clock=taking.clock))
            for p, r in taking.askers
        ]

    def _write_manifest(self, taking: _Taking) -> None:
        current = self._maps.map
        assert current is not None
        manifest = {
            "format": FORMAT,
            "job": self._job,
            "clock": taking.clock,
            "files": sorted(taking.files),
            "chunks": taking.chunks,
            "tables": self._maps.tables,
            "chunk_bytes": self._chunk_bytes,
            "map": current.to_dict(),
            "steps": self._steps.to_dict(),
            "workers": self._members.num_workers,
        }
        if set(taking.sums) == set(taking.files):  # (every server of this release sends one)
            manifest = seal({**manifest, "sums": taking.sums})
        write_manifest(taking.directory, manifest)
