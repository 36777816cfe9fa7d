"""Typed headers: one definition per message, with its builder and its reader.

Every message trimtab sends has here a ``TypedDict`` of its header (the wire's short
keys, each documented for that message), a builder with readable keyword arguments
that returns the very dict the roles built as a literal (the same msgpack bytes), and,
for what a node receives, a reader that checks the header with
:func:`~trimtab.protocol.messages.field` and returns it typed, raising
``ProtocolError(ErrorCode.MALFORMED.value, ...)`` for a missing or mistyped key. The
definitions live by plane: :mod:`.control` (membership, teardown, tools, barriers,
broadcast), :mod:`.checkpoint` (checkpoints and resuming), :mod:`.collective` (GATHER
and GATHERED: Horovod's collectives),
:mod:`.placement` (maps, migration, step and load reports), :mod:`.data` (chunks between
workers and servers) and :mod:`.state` (a chunk's optimizer state); import them from
here. ERROR is
:func:`~trimtab.protocol.messages.error_header` / :func:`~trimtab.protocol.messages.read_error`.

Builders check nothing and readers check only types: what a value means for the
receiver's state (a chunk it owns, a clock it can take) is the receiver's to judge.
None of them blocks; all are thread-safe. The key common to every header: ``o`` (the op),
``i`` (request id), ``j`` (job id), see :class:`~trimtab.protocol.messages.WireHeader`.

Words (one each, everywhere: code, logs, docs):
    clock       a worker's iterations: steps it completed, from 0.
    job clock   the lowest clock among the workers (steps every worker reported done).
    round       a chunk's aggregation rounds completed on its server (under BSP, the
                round a push joins is the push's clock).
    version     a chunk's updates applied.
    epoch       the placement map's; every change of owners makes a new one.
    floor       a worker's routing floor: the oldest epoch by which it still has a data
                request unanswered (a drained server retires once every floor passed).
    cut         the clock from which a moving chunk belongs to its new owner.

Short keys, and what each carries in which message:
    ``k``       clock: PUSH, REPORT, MAP answering a DECLARE of a table the job has (the
                worker's, to go on from); per table: LEAVE. round: VALUE, HANDOVER. job
                clock: OK answering LOAD. A checkpoint's: SNAPSHOT, SNAPSHOT_DONE, OK
                answering CHECKPOINT.
    ``v``       version: VALUE, HANDOVER; in PUSH, the version the worker last read.
    ``e``       epoch: INIT, PUSH, PULL (the sender's map), MOVED, HANDOVER (the
                server's), MAP_GET (the one wanted). Spelt ``epoch`` in MAP, MIGRATE,
                EXTEND, MAP_ACK, MIGRATE_ACK, HANDED, the OKs answering REPORT and STATUS, and
                the ACK answering STATS.
    ``lo``      floor: HEARTBEAT, MAP_GET, REPORT.
    ``cuts``    chunk id (a decimal string) -> cut: MIGRATE_ACK, MAP answering MAP_GET.
    ``dir``     a checkpoint's directory: SNAPSHOT, RESTORE; ``file``/``files`` a
                server's file(s) in it: SNAPSHOT_DONE, RESTORE; ``late`` the round of a
                chunk already past the clock, ``err`` why not: SNAPSHOT_DONE, RESTORED;
                ``path`` a complete checkpoint: OK answering CHECKPOINT.
    ``c``       chunk id: INIT, PUSH, PULL, VALUE, MOVED, HANDOVER; chunk ids: HANDED.
    ``n``       element count: INIT, PUSH, VALUE, HANDOVER; requests served: LOAD; a
                checkpoint's number: SNAPSHOT, SNAPSHOT_DONE; chunks loaded: RESTORED.
    ``b``       the inline tensor bytes: PUSH, VALUE; batch size: REPORT.
    ``sm``      [arena, offset, capacity] of a shared-memory slot: PUSH; IN_SLOT (1),
                the value is in that slot: VALUE.
    ``dt``      wire dtype name; ``z`` no tensor; ``w`` weight (batch size); ``r`` worker
                rank; ``s`` server rank (in HANDOVER, the sender's); ``t`` a member's
                credential: worker data requests, HANDOVER, REGISTERED; ``tk`` a
                server's join ticket: REGISTER; ``ad`` an adoption's number: OK answering
                ADOPT, INIT; ``g`` an adoption's grant (OK answering ADOPT, INIT), or in
                PUSH: answer the mean gradient; ``hp`` hyperparameters; ``st`` optimizer
                state (HANDOVER, STATE, STATE_SET);
                ``p`` chunk counters; ``cs``/``ms``/``cpu`` compute and communication
                seconds and CPU share; ``sv`` per-server spans; ``step`` job clock: LOAD;
                ``t`` table (a worker's n-th optimizer): DECLARE; ``ak`` acknowledge
                receipt with CREDIT: PUSH; ``gm`` the round whose mean gradient is asked
                for: PULL.
"""

from __future__ import annotations

from trimtab.protocol.checkpoint import (
    CheckpointHeader,
    CheckpointReplyHeader,
    RestoredHeader,
    RestoreHeader,
    SnapshotDoneHeader,
    SnapshotHeader,
    checkpoint,
    checkpoint_reply,
    read_checkpoint_reply,
    read_restore,
    read_restored,
    read_snapshot,
    read_snapshot_done,
    restore,
    restored,
    snapshot,
    snapshot_done,
)
from trimtab.protocol.collective import (
    GatheredHeader,
    GatherHeader,
    gather,
    gathered,
    read_gather,
    read_gathered,
)
from trimtab.protocol.control import (
    AbortHeader,
    AdoptHeader,
    AdoptReplyHeader,
    BarrierHeader,
    BcastGetHeader,
    BcastPutHeader,
    BcastValueHeader,
    DoneHeader,
    HeartbeatHeader,
    LeaveHeader,
    OkHeader,
    RegisteredHeader,
    RegisterHeader,
    ScaleHeader,
    ScaleReplyHeader,
    ShutdownHeader,
    StatusHeader,
    StatusReplyHeader,
    abort,
    adopt,
    adopt_reply,
    barrier,
    bcast_get,
    bcast_put,
    bcast_value,
    done,
    heartbeat,
    heartbeat_echo,
    leave,
    ok,
    read_abort,
    read_adopt,
    read_adopt_reply,
    read_barrier,
    read_bcast_get,
    read_bcast_put,
    read_bcast_value,
    read_clock,
    read_done,
    read_floor,
    read_leave,
    read_register,
    read_registered,
    read_scale,
    read_scale_reply,
    read_status_reply,
    register_server,
    register_worker,
    registered,
    scale,
    scale_reply,
    shutdown,
    status_reply,
    status_request,
    worker_heartbeat,
)
from trimtab.protocol.credit import CreditHeader, credit, read_credit
from trimtab.protocol.data import (
    IN_SLOT,
    SEED_ROOT,
    AckHeader,
    HandoverHeader,
    InitHeader,
    MovedHeader,
    PullHeader,
    PushHeader,
    StatsHeader,
    StatsReplyHeader,
    ValueHeader,
    ack,
    handover,
    init,
    moved,
    pull,
    push,
    read_handover,
    read_init,
    read_moved,
    read_pull,
    read_push,
    read_stats_reply,
    read_value,
    stats_reply,
    stats_request,
    value,
)
from trimtab.protocol.placement import (
    DeclareHeader,
    ExtendHeader,
    HandedHeader,
    JobMapHeader,
    MapAckHeader,
    MapGetHeader,
    MapReplyHeader,
    MigrateAckHeader,
    MigrateHeader,
    declare,
    declared_again,
    extend,
    handed,
    job_map,
    map_ack,
    map_get,
    map_reply,
    migrate,
    migrate_ack,
    read_declare,
    read_extend,
    read_handed,
    read_job_map,
    read_map_ack,
    read_map_get,
    read_map_reply,
    read_migrate,
    read_migrate_ack,
    read_tables,
)
from trimtab.protocol.reports import (
    JobClockHeader,
    LoadHeader,
    ReportHeader,
    ReportReplyHeader,
    batch_sizes,
    job_clock,
    load,
    read_job_clock,
    read_load,
    read_report,
    read_report_reply,
    report,
    report_reply,
)
from trimtab.protocol.state import (
    StateGetHeader,
    StateHeader,
    StateMeta,
    StateSetHeader,
    read_state,
    read_state_get,
    read_state_set,
    state,
    state_get,
    state_set,
)

__all__ = [
    "IN_SLOT",
    "SEED_ROOT",
    "AbortHeader",
    "AckHeader",
    "AdoptHeader",
    "AdoptReplyHeader",
    "BarrierHeader",
    "BcastGetHeader",
    "BcastPutHeader",
    "BcastValueHeader",
    "CheckpointHeader",
    "CheckpointReplyHeader",
    "CreditHeader",
    "DeclareHeader",
    "DoneHeader",
    "ExtendHeader",
    "GatherHeader",
    "GatheredHeader",
    "HandedHeader",
    "HandoverHeader",
    "HeartbeatHeader",
    "InitHeader",
    "JobClockHeader",
    "JobMapHeader",
    "LeaveHeader",
    "LoadHeader",
    "MapAckHeader",
    "MapGetHeader",
    "MapReplyHeader",
    "MigrateAckHeader",
    "MigrateHeader",
    "MovedHeader",
    "OkHeader",
    "PullHeader",
    "PushHeader",
    "RegisterHeader",
    "RegisteredHeader",
    "ReportHeader",
    "ReportReplyHeader",
    "RestoreHeader",
    "RestoredHeader",
    "ScaleHeader",
    "ScaleReplyHeader",
    "ShutdownHeader",
    "SnapshotDoneHeader",
    "SnapshotHeader",
    "StateGetHeader",
    "StateHeader",
    "StateMeta",
    "StateSetHeader",
    "StatsHeader",
    "StatsReplyHeader",
    "StatusHeader",
    "StatusReplyHeader",
    "ValueHeader",
    "abort",
    "ack",
    "adopt",
    "adopt_reply",
    "barrier",
    "batch_sizes",
    "bcast_get",
    "bcast_put",
    "bcast_value",
    "checkpoint",
    "checkpoint_reply",
    "credit",
    "declare",
    "declared_again",
    "done",
    "extend",
    "gather",
    "gathered",
    "handed",
    "handover",
    "heartbeat",
    "heartbeat_echo",
    "init",
    "job_clock",
    "job_map",
    "leave",
    "load",
    "map_ack",
    "map_get",
    "map_reply",
    "migrate",
    "migrate_ack",
    "moved",
    "ok",
    "pull",
    "push",
    "read_abort",
    "read_adopt",
    "read_adopt_reply",
    "read_barrier",
    "read_bcast_get",
    "read_bcast_put",
    "read_bcast_value",
    "read_checkpoint_reply",
    "read_clock",
    "read_credit",
    "read_declare",
    "read_done",
    "read_extend",
    "read_floor",
    "read_gather",
    "read_gathered",
    "read_handed",
    "read_handover",
    "read_init",
    "read_job_clock",
    "read_job_map",
    "read_leave",
    "read_load",
    "read_map_ack",
    "read_map_get",
    "read_map_reply",
    "read_migrate",
    "read_migrate_ack",
    "read_moved",
    "read_pull",
    "read_push",
    "read_register",
    "read_registered",
    "read_report",
    "read_report_reply",
    "read_restore",
    "read_restored",
    "read_scale",
    "read_scale_reply",
    "read_snapshot",
    "read_snapshot_done",
    "read_state",
    "read_state_get",
    "read_state_set",
    "read_stats_reply",
    "read_status_reply",
    "read_tables",
    "read_value",
    "register_server",
    "register_worker",
    "registered",
    "report",
    "report_reply",
    "restore",
    "restored",
    "scale",
    "scale_reply",
    "shutdown",
    "snapshot",
    "snapshot_done",
    "state",
    "state_get",
    "state_set",
    "stats_reply",
    "stats_request",
    "status_reply",
    "status_request",
    "value",
    "worker_heartbeat",
]
