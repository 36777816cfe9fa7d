"""Control-plane headers of what the policies measure: a worker's step report and its
answer (the batch sizes, under a batching policy), a server's load report, the job's
clock.

Builders and readers as in :mod:`trimtab.protocol.placement` (the same contract, the
keys in :mod:`trimtab.protocol.headers`). None blocks; all are thread-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from trimtab.protocol.messages import (
    NUMBER,
    Control,
    Header,
    KeySpec,
    WireHeader,
    field,
    fields,
    int_list,
)

if TYPE_CHECKING:
    from typing import NotRequired  # see messages.py: never evaluated at run time

_OK = int(Control.OK)
_REPORT = int(Control.REPORT)
_LOAD = int(Control.LOAD)


class ReportHeader(WireHeader):
    """REPORT, worker -> coordinator: one step's measurements; answered
    :func:`report_reply` (or, under a batch-sizing policy, :func:`batch_sizes` once
    every worker reported the step)."""

    k: int  # the worker's clock: the step measured
    b: int  # its batch size in that step
    cs: float  # compute seconds
    ms: float  # communication seconds (waiting for values)
    cpu: float  # CPU seconds over compute seconds, at most 1
    lo: NotRequired[int]  # the worker's routing floor
    sv: NotRequired[list[list[float]]]  # per server: [rank, span, wait span, bytes]


def report(
    *,
    clock: int,
    batch: int,
    compute_s: float,
    comm_s: float,
    cpu_share: float,
    floor: int,
    spans: list[list[float]],
) -> ReportHeader:
    """``spans`` empty (no per-server timing) leaves ``sv`` out."""
    header: ReportHeader = {
        "o": _REPORT,
        "k": clock,
        "b": batch,
        "cs": compute_s,
        "ms": comm_s,
        "cpu": cpu_share,
        "lo": floor,
    }
    if spans:
        header["sv"] = spans
    return header


_REPORT_KEYS: KeySpec = (("k", int), ("b", int), ("cs", NUMBER), ("ms", NUMBER), ("cpu", NUMBER))


def read_report(header: Header) -> ReportHeader:
    """Checks the measurements' types, ``lo`` and that ``sv`` is a list if present; the
    rows of ``sv`` (server ranks in range) are the coordinator's to check."""
    fields(header, _REPORT_KEYS, (("lo", int), ("sv", list)))
    return cast(ReportHeader, header)


class ReportReplyHeader(WireHeader):
    """OK answering REPORT."""

    sizes: NotRequired[list[int]]  # under a batch-sizing policy: each worker's next batch
    epoch: int  # the latest published map: fetch it if yours is older
    refresh: NotRequired[bool]  # SaPS: you lag; skip ahead to ``lead``
    lead: NotRequired[int]  # the leading worker's clock


def report_reply(*, rid: int, epoch: int, lead: int | None = None) -> ReportReplyHeader:
    """The reply under equal batch sizes; ``lead`` (SaPS: this worker lags) adds
    ``refresh`` and ``lead``."""
    header: ReportReplyHeader = {"o": _OK, "i": rid, "epoch": epoch}
    if lead is not None:
        header["refresh"] = True
        header["lead"] = lead
    return header


def batch_sizes(*, rid: int, sizes: list[int], epoch: int) -> ReportReplyHeader:
    """The reply under a batch-sizing policy (every worker's next batch size)."""
    return {"o": _OK, "i": rid, "sizes": sizes, "epoch": epoch}


def read_report_reply(header: Header) -> ReportReplyHeader:
    fields(header, (("epoch", int),), (("refresh", bool), ("lead", int)))
    if "sizes" in header:
        int_list(header, "sizes")
    return cast(ReportReplyHeader, header)


class LoadHeader(WireHeader):
    """LOAD, server -> coordinator, every LOAD_REPORT_S: cumulative figures for the
    speed estimate; answered :func:`job_clock`."""

    busy: float  # seconds spent serving data requests
    bytes: int  # bytes moved, both ways (shared memory included)
    n: int  # data requests served
    step: int  # the job clock as this server knows it: its highest round, or what it was told
    bo: NotRequired[int]  # of ``bytes``, those sent (values); the rest came in
    gr: NotRequired[dict[str, int]]  # a growing table's counters on its chunks (summed)


def load(
    *, busy_s: float, nbytes: int, requests: int, step: int, bytes_out: int | None = None
) -> LoadHeader:
    header: LoadHeader = {
        "o": _LOAD, "i": 0, "busy": busy_s, "bytes": nbytes, "n": requests, "step": step
    }  # fmt: skip
    if bytes_out is not None:
        header["bo"] = bytes_out
    return header


def read_load(header: Header) -> LoadHeader:
    fields(
        header,
        (("busy", NUMBER), ("bytes", NUMBER), ("n", int), ("step", int)),
        (("bo", int), ("gr", dict)),
    )
    return cast(LoadHeader, header)


class JobClockHeader(WireHeader):
    """OK answering LOAD: the job's clock, so a server that owns nothing knows the step."""

    k: int  # the job clock (see the key legend)


def job_clock(*, clock: int) -> JobClockHeader:
    return {"o": _OK, "i": 0, "k": clock}


def read_job_clock(header: Header) -> JobClockHeader:
    field(header, "k", int)
    return cast(JobClockHeader, header)
