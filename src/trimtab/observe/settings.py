"""The live view's settings: the dashboard's address, where run records go, and the
trace. Pure (no web framework is imported here), so that the launcher can pass them
on to the coordinator's command line."""

from __future__ import annotations

import dataclasses

from trimtab.errors import ConfigError
from trimtab.settings import flag

#: Where run records go by default: ``runs/<job id>/`` under the working directory.
DEFAULT_RUNS_DIR = "runs"


@dataclasses.dataclass(frozen=True)
class ObserveSettings:
    """How the coordinator shows its job. Construction raises :class:`ConfigError` for
    a port out of range.

    Attributes:
        dashboard_port: the dashboard's (and ``/metrics``') port on ``dashboard_host``;
            0 picks a free one (printed at start).
        no_dashboard: serve no dashboard and no ``/metrics``.
        dashboard_host: the interface the dashboard binds: loopback unless asked.
        runs_dir: run records go to ``<runs_dir>/<job id>/`` (empty: no record).
        trace: the directory every process's trace goes to (empty: no trace;
            :mod:`trimtab.observe.timeline`).
    """

    dashboard_port: int = dataclasses.field(
        default=0,
        metadata=flag(
            "--dashboard-port",
            "serve the live dashboard and /metrics on this port (0: a free one, printed)",
            metavar="PORT",
        ),
    )
    no_dashboard: bool = dataclasses.field(
        default=False, metadata=flag("--no-dashboard", "serve no dashboard and no /metrics")
    )
    dashboard_host: str = dataclasses.field(
        default="127.0.0.1",
        metadata=flag(
            "--dashboard-host",
            "the interface the dashboard binds (127.0.0.1; another only if you mean it)",
            metavar="HOST",
        ),
    )
    runs_dir: str = dataclasses.field(
        default=DEFAULT_RUNS_DIR,
        metadata=flag(
            "--runs-dir",
            f"write the run record (config, events, metrics, summary) to DIR/<job id>/ "
            f"(default {DEFAULT_RUNS_DIR}; '' for none)",
            metavar="DIR",
        ),
    )

    trace: str = dataclasses.field(
        default="",
        metadata=flag(
            "--trace",
            "write a Chrome-trace timeline of every process (push, merge, update, reply "
            "per chunk) to DIR, merged into DIR/trace.json at the end (Perfetto reads it)",
            metavar="DIR",
        ),
    )

    def __post_init__(self) -> None:
        if not 0 <= self.dashboard_port <= 65535:
            raise ConfigError(
                f"--dashboard-port must be 0 (a free port) to 65535, not {self.dashboard_port}"
            )
