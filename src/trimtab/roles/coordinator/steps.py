"""Step reports (REPORT): each worker's clock and timings, the batch sizes of the next
step (LB-BSP), SaPS's directive to a lagging worker, and the workers' per-server
traffic for PSLD's speed figures. Pure: operations return the replies to send."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from typing import Any

from trimtab.errors import ConfigError, ProtocolError
from trimtab.policies.batching import BatchSizingPolicy, WorkerSample
from trimtab.policies.detection import StragglerDetector
from trimtab.policies.psld import SpeedEstimator
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.coordinator.members import Member, Role
from trimtab.roles.coordinator.outbox import Outbox, Send
from trimtab.transport.base import Peer

#: Where no policy acts on every step's timings, workers report at most this often.
REPORT_EVERY_S = 0.05

#: Samples kept per worker for the batch-sizing policy: more than any reads (NARX fits
#: on its last 20, the communication time is taken over the last 5).
HISTORY_STEPS = 50

#: Steps a partial step's traffic is kept while some worker has not reported it: under
#: BSP (which live placement needs) workers are within a step of each other, so a step
#: still partial this many steps later will not complete (a report was refused or lost).
TRAFFIC_KEEP_STEPS = 8


def report_interval_s(per_step: bool) -> float:
    """How often workers report their step timings: every step where a policy acts on
    each one (LB-BSP's sizes, SaPS's directives, PSLD's and forced migrations, scaling),
    else at most every :data:`REPORT_EVERY_S`, so that jobs of very short steps do not
    spend a control round trip per step."""
    return 0.0 if per_step else REPORT_EVERY_S


class Steps:
    """What the workers report of their steps. Not thread-safe: the coordinator's loop
    owns it.

    Args:
        num_workers: the job's workers.
        batching: sizes each step's global batch (asked once every worker reported the
            step, if :attr:`~BatchSizingPolicy.adaptive`).
        detector: names the lagging workers, for a policy that
            ``skips_stragglers``.
        skips_stragglers: tell a lagging worker to refresh and skip ahead (SaPS).
    """

    def __init__(
        self,
        num_workers: int,
        batching: BatchSizingPolicy,
        detector: StragglerDetector,
        *,
        skips_stragglers: bool,
    ) -> None:
        self.num_workers = num_workers
        self._batching = batching
        self._detector = detector
        self._skips_stragglers = skips_stragglers
        #: Each worker's clock: the steps it reported.
        self.clocks: dict[int, int] = {}
        self._history: dict[int, collections.deque[WorkerSample]] = {}
        # Under adaptive batching, the reports of a step until every worker's is in:
        # clock -> [(peer, request id, rank, batch)].
        self._waiting: dict[int, list[tuple[Peer, int, int, int]]] = {}
        # Worker-observed traffic per clock, until every worker reported it:
        # clock -> (reports so far, server -> [longest span, shortest wait span, bytes]).
        self._traffic: dict[int, tuple[int, dict[int, list[float]]]] = {}

    @property
    def job_clock(self) -> int:
        """The slowest worker's clock (0 before any report)."""
        return min(self.clocks.values(), default=0)

    def boundary(self) -> int | None:
        """The job's clock once every worker has reported at least once, else None."""
        if len(self.clocks) < self.num_workers or not self.clocks:
            return None
        return self.job_clock

    def forget(self, rank: int) -> None:
        """Worker ``rank`` was lost: its clock and samples no longer count; the job's
        clock and the per-step counts go on over the others."""
        self.clocks.pop(rank, None)
        self._history.pop(rank, None)
        self.num_workers -= 1

    def joined(self, rank: int, clock: int) -> None:
        """Worker ``rank`` joined the running job; its first step is ``clock``."""
        self.clocks[rank] = clock
        self.num_workers += 1

    def histories(self, ranks: list[int]) -> dict[int, list[WorkerSample]]:
        """The samples of workers ``ranks`` (empty for one that reported none), for a
        batch-sizing policy."""
        return {r: list(self._history.get(r, ())) for r in ranks}

    def record(self, member: Member, header: Header) -> tuple[int, WorkerSample]:
        """Take a worker's REPORT (``k`` its clock, ``b`` ``cs`` ``ms`` ``cpu`` its
        batch, compute and communication seconds and CPU share). Returns the step's
        clock and sample. Raises :class:`ProtocolError`: BAD_STATE from a server,
        MALFORMED for a missing or out-of-range figure."""
        if member.role is not Role.WORKER:
            raise ProtocolError(ErrorCode.BAD_STATE.value, "only workers report steps")
        report = headers.read_report(header)
        clock = report["k"]
        try:
            sample = WorkerSample(
                rank=member.rank,
                batch=report["b"],
                compute_s=max(float(report["cs"]), 1e-9),
                comm_s=max(float(report["ms"]), 0.0),
                cpu_share=min(max(float(report["cpu"]), 0.0), 1.0),
            )
        except ValueError as exc:
            raise ProtocolError(ErrorCode.MALFORMED.value, f"bad step report: {exc}") from None
        history = self._history.setdefault(member.rank, collections.deque(maxlen=HISTORY_STEPS))
        history.append(sample)
        self.clocks[member.rank] = clock + 1
        return clock, sample

    def observe_traffic(
        self, clock: int, spans: Any, servers: int, speeds: SpeedEstimator | None
    ) -> dict[int, tuple[float, float, float]] | None:
        """Take one worker's per-server spans of step ``clock`` (``[[server, from first
        push, from the wait, bytes], ...]``, see the frontend's ``spans_of_step``);
        once every worker's are in, return the step's figures of each server (``server
        -> (longest first span, shortest wait span, bytes of all workers)``, for the run
        record) and give them to ``speeds`` where given (PSLD's): its bytes of all
        workers over the longest first span (a lower bound of its speed) and over the
        shortest wait span (the worker that pushed last waited least for others); None
        before. Raises a MALFORMED :class:`ProtocolError` for a malformed list or a
        server index not below ``servers``."""
        rows: list[tuple[int, float, float, float]] = []
        try:
            for row in spans:
                server, span, tail, nbytes = row
                if not isinstance(server, int) or not 0 <= server < servers:
                    raise ValueError(f"no server {server!r}")
                rows.append((server, float(span), float(tail), float(nbytes)))
        except (TypeError, ValueError) as exc:
            raise ProtocolError(
                ErrorCode.MALFORMED.value, f"bad per-server spans in a step report: {exc}"
            ) from None
        reports, seen_by_server = self._traffic.get(clock, (0, {}))
        for server, span, tail, nbytes in rows:
            seen = seen_by_server.setdefault(server, [0.0, float("inf"), 0.0])
            seen[0] = max(seen[0], span)
            seen[1] = min(seen[1], tail)
            seen[2] += nbytes
        if reports + 1 < self.num_workers:
            self._traffic[clock] = (reports + 1, seen_by_server)
            for old in [k for k in self._traffic if k < clock - TRAFFIC_KEEP_STEPS]:
                del self._traffic[old]
            return None
        self._traffic.pop(clock, None)
        figures = {s: (span, tail, nbytes) for s, (span, tail, nbytes) in seen_by_server.items()}
        for server, (span, tail, nbytes) in figures.items():
            if speeds is not None:
                speeds.observe_step(server, nbytes, span, tail)
        return figures

    def reply(
        self, member: Member, rid: int, clock: int, sample: WorkerSample, epoch: int
    ) -> Outbox:
        """The answer to a REPORT of step ``clock``: OK with the published map's
        ``epoch`` now (and, for a lagging worker under SaPS, ``refresh`` and the leader's
        clock); under adaptive batching, every worker's OK with the next step's
        ``sizes`` once the last worker reported the step. Raises :class:`ConfigError`
        if the batch cannot be split as configured."""
        if not self._batching.adaptive:
            lags = self._skips_stragglers and member.rank in self._detector.stragglers(self.clocks)
            lead = max(self.clocks.values()) if lags else None
            return [Send(member.peer, headers.report_reply(rid=rid, epoch=epoch, lead=lead))]
        waiting = self._waiting.setdefault(clock, [])
        waiting.append((member.peer, rid, member.rank, sample.batch))
        if len(waiting) < self.num_workers:
            return []
        del self._waiting[clock]
        total = sum(b for _, _, _, b in waiting)
        history = {r: list(h) for r, h in self._history.items()}
        sizes = self._batching.batch_sizes(history, total)
        vector = [sizes[r] for r in range(self.num_workers)]
        return [
            Send(peer, headers.batch_sizes(rid=r, sizes=vector, epoch=epoch))
            for peer, r, _, _ in waiting
        ]

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the steps, as JSON values: each worker's clock and
        recent samples (all the batch-sizing policy reads). Pure; :meth:`restore` takes it."""
        return {
            "clocks": {str(r): c for r, c in self.clocks.items()},
            "history": {
                str(r): [dataclasses.asdict(s) for s in h] for r, h in self._history.items()
            },
        }

    def restore(self, saved: Mapping[str, Any], clock: int) -> None:
        """Go on from a checkpoint at ``clock``: every worker has done ``clock`` steps, and
        the samples :meth:`to_dict` kept are the batch-sizing policy's history again.
        Raises :class:`ConfigError` for a malformed ``saved``."""
        try:
            history = {
                int(r): collections.deque(
                    (WorkerSample(**s) for s in samples), maxlen=HISTORY_STEPS
                )
                for r, samples in saved.get("history", {}).items()
            }
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"a checkpoint's step history is malformed: {exc}") from None
        self._history = history
        self.clocks = {r: clock for r in range(self.num_workers)}
