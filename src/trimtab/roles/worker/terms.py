"""The job's terms a worker learns when it declares its tensors (:class:`JobTerms`, out
of :mod:`trimtab.roles.worker.context`, which re-exports it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class JobTerms:
    """The job's terms a worker learns when it declares its tensors (the coordinator's
    DECLARE reply). The defaults are a job's before anything was declared.

    Attributes:
        batching: the batch-sizing policy (``equal``, ``lbbsp``, ...); under any but
            ``equal`` each step's REPORT is answered with every worker's next size.
        report_s: the least seconds between two step reports (0: every step).
        consistency: ``bsp``, ``asp``, ``ssp(s)`` or ``saps``; staleness: ssp's bound.
        time_servers: whether workers time each server's replies (PSLD).
        elastic: workers may be lost or join (bsp): each step ends at the coordinator's
            step boundary, whose answer carries every rank's next batch size.
    """

    batching: str = "equal"
    report_s: float = 0.0
    consistency: str = "bsp"
    staleness: int = 0
    time_servers: bool = False
    elastic: bool = False

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> JobTerms:
        """The terms in a DECLARE reply (absent fields take the defaults)."""
        return cls(
            batching=str(reply.get("batching", "equal")),
            report_s=float(reply.get("report_s", 0.0)),
            consistency=str(reply.get("consistency", "bsp")),
            staleness=int(dict(reply.get("consistency_args") or {}).get("staleness", 0)),
            time_servers=bool(reply.get("time_servers", False)),
            elastic=bool(reply.get("elastic", False)),
        )

    @property
    def sizes_batches(self) -> bool:
        """Whether the coordinator sets each worker's batch size every step (its REPORT
        reply carries the sizes, so a worker waits for it)."""
        return self.batching != "equal" or self.elastic
