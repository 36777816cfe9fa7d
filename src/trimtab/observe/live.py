"""The live view of one coordinator: the readers of its event stream, started together
and closed together. The job state (:mod:`.state`) always; the run record
(:mod:`.records`) unless ``runs_dir`` is empty; the dashboard and ``/metrics``
(:mod:`.dashboard`, :mod:`.metrics`) unless ``no_dashboard``, and only where the
``observe`` extra is installed: without it the coordinator says how to get it and
runs on without them; the coordinator's trace (:mod:`.timeline`) with ``trace``.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.observe.records import RunRecord, write_config
from trimtab.observe.settings import ObserveSettings
from trimtab.observe.state import JobState
from trimtab.observe.timeline import CoordinatorTrace
from trimtab.roles.coordinator.events import Events
from trimtab.runtime.trace import Trace

log = logging.getLogger("trimtab.observe")

#: What the dashboard needs beyond trimtab's own dependencies.
EXTRA = ("starlette", "uvicorn", "prometheus_client")


def missing_extra() -> list[str]:
    """The modules of the ``observe`` extra that are not installed."""
    return [m for m in EXTRA if importlib.util.find_spec(m) is None]


class Live:
    """The readers of ``events`` that ``settings`` ask for, for job ``job`` (whose
    resolved ``config`` goes to the run record). Starting binds the dashboard's port;
    :attr:`lines` says where to look (printed by the coordinator). Raises
    :class:`ConfigError` if the record cannot be written or the port bound.

    Attributes:
        state: the job's latest figures.
        record: the run record, or None.
        dashboard: the dashboard's server, or None (none asked, or not started yet:
            it starts in a thread of its own once the port is bound).
        metrics: the Prometheus metrics, or None (likewise).
    """

    def __init__(
        self, events: Events, settings: ObserveSettings, job: str, config: dict[str, Any]
    ) -> None:
        self.state = JobState()
        self.lines: list[str] = []
        self.record: RunRecord | None = None
        self.dashboard: Any = None
        self.metrics: Any = None
        self._starting: threading.Thread | None = None
        readers: list[Any] = [self.state]
        #: ``--trace``: the coordinator's own trace (its events), written at close.
        self.trace = Trace(settings.trace, "coordinator") if settings.trace else None
        if self.trace is not None:
            readers.append(CoordinatorTrace(self.trace))
            self.lines.append(f"tracing to {settings.trace}")
        if settings.runs_dir:
            directory = Path(settings.runs_dir) / job
            write_config(directory, "coordinator", config)
            self.record = RunRecord(directory, self.state)
            readers.append(self.record)
            self.lines.append(f"run record in {directory}")
        if not settings.no_dashboard:
            missing = missing_extra()
            if missing:
                self.lines.append(
                    f"no dashboard and no /metrics: {', '.join(missing)} missing "
                    f"(pip install 'trimtab[observe]'; --no-dashboard silences this)"
                )
            else:
                self._serve(events, settings)
        for reader in readers:  # the events before now (the job's own) too
            events.listen(reader, replay=True)

    def _serve(self, events: Events, settings: ObserveSettings) -> None:
        """Bind the dashboard's port now (its address is printed at once); load the web
        framework and serve in a thread, so that the job does not wait for it."""
        sock = bind(settings.dashboard_host, settings.dashboard_port)
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}/"
        self.lines.append(f"dashboard at {url} (Prometheus metrics at {url}metrics)")
        self._starting = threading.Thread(
            target=self._start, args=(events, sock), name="trimtab-dashboard-start", daemon=True
        )
        self._starting.start()

    def _start(self, events: Events, sock: socket.socket) -> None:
        try:
            from trimtab.observe.dashboard import Dashboard
            from trimtab.observe.metrics import Metrics

            metrics = Metrics()
            events.listen(metrics, replay=True)  # (what came meanwhile too)
            self.metrics = metrics
            self.dashboard = Dashboard(events, metrics, sock)
        except Exception:
            log.exception("the dashboard did not start; the job goes on without it")
            sock.close()

    def close(self) -> None:
        """Write the record's summary and the trace, and stop the dashboard. Blocks a few
        seconds at most; idempotent."""
        if self.record is not None:
            self.record.close()
        if self._starting is not None:
            self._starting.join(10)
        if self.dashboard is not None:
            self.dashboard.close()
        if self.trace is not None:
            self.trace.save()


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port). Raises
    :class:`ConfigError` if it cannot be bound."""
    try:
        return socket.create_server((host, port))
    except OSError as exc:
        raise ConfigError(
            f"the dashboard cannot bind {host}:{port}: {exc} (--dashboard-port 0 takes a "
            f"free port; --no-dashboard serves none)"
        ) from None
