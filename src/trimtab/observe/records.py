"""A run's record on disk, written from the event stream: ``<runs_dir>/<job id>/`` holds

- ``config.json``: the resolved configuration (the launcher's, and the coordinator's),
- ``events.jsonl``: every event of the stream, one JSON object a line,
- ``metrics.jsonl``: the job's figures (:meth:`JobState.snapshot`) every
  :data:`METRICS_EVERY_S` seconds,
- ``summary.json``: what the run came to (:meth:`JobState.summary`), at its end.

``trimtab report RUN_DIR`` (:mod:`.report`) renders it. A replacement coordinator
appends to the same files.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import IO, Any

from trimtab.errors import ConfigError
from trimtab.observe.state import JobState
from trimtab.roles.coordinator.events import Event

#: How often a line of figures goes to ``metrics.jsonl``.
METRICS_EVERY_S = 2.0

CONFIG, EVENTS, METRICS, SUMMARY = "config.json", "events.jsonl", "metrics.jsonl", "summary.json"


def write_config(directory: Path, name: str, config: dict[str, Any]) -> None:
    """Add ``config`` under ``name`` to the run's ``config.json`` (made if missing).
    Raises :class:`ConfigError` if the directory cannot be written."""
    path = directory / CONFIG
    try:
        directory.mkdir(parents=True, exist_ok=True)
        known = json.loads(path.read_text()) if path.exists() else {}
        known[name] = config
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(known, indent=2, default=str) + "\n")
        tmp.replace(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot write the run record's {path}: {exc}") from None


def record_launch(runs_dir: str, job: str, config: Any, command: list[str]) -> None:
    """Write the launcher's resolved ``config`` (a dataclass) and the workers'
    ``command`` to job ``job``'s record under ``runs_dir`` (nothing if it is empty).
    Raises :class:`ConfigError` if it cannot be written."""
    if runs_dir:
        launch = {**dataclasses.asdict(config), "command": command}
        write_config(Path(runs_dir) / job, "launch", launch)


class RunRecord:
    """Writes one run's record in ``directory`` (made if missing). Call it with each
    event (a listener; quick: a buffered write); a thread writes the metrics lines.
    :meth:`close` writes the summary and stops that thread. Raises
    :class:`ConfigError` if ``directory`` cannot be written."""

    def __init__(self, directory: Path, state: JobState) -> None:
        self.directory = directory
        self._state = state
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._events: IO[str] = (directory / EVENTS).open("a", buffering=1 << 16)
            self._metrics: IO[str] = (directory / METRICS).open("a", buffering=1)
        except OSError as exc:
            raise ConfigError(
                f"cannot write the run record in {directory}: {exc} (--runs-dir DIR elsewhere, "
                f"or --runs-dir '' for none)"
            ) from None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._every, name="trimtab-record", daemon=True)
        self._thread.start()

    def __call__(self, event: Event) -> None:
        line = json.dumps(event, default=str)
        with self._lock:
            if not self._events.closed:
                self._events.write(line + "\n")

    def _every(self) -> None:
        while not self._closed.wait(METRICS_EVERY_S):
            self._write_metrics()

    def _write_metrics(self) -> None:
        line = json.dumps(self._state.snapshot(), default=str)
        with self._lock:
            if not self._metrics.closed:
                self._metrics.write(line + "\n")
            if not self._events.closed:
                self._events.flush()

    def close(self) -> None:
        """Write the last metrics line and the summary; close the files. Blocks for the
        writes; idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(5)
        self._write_metrics()
        summary = self._state.summary()
        with self._lock:
            self._events.close()
            self._metrics.close()
        (self.directory / SUMMARY).write_text(json.dumps(summary, indent=2, default=str) + "\n")


def read_events(directory: Path) -> list[Event]:
    """The events of the run recorded in ``directory``. Raises :class:`ConfigError` if
    it holds no record (or a line is not JSON)."""
    path = directory / EVENTS
    if not path.exists():
        raise ConfigError(f"{directory} holds no run record (no {EVENTS}); give a runs/<id>/")
    events = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                events.append(json.loads(line))
            except ValueError as exc:
                raise ConfigError(f"{path}:{number} is not JSON: {exc}") from None
    return events
