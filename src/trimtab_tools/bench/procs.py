"""The processes of a peer's job in a benchmark (MXNet's, the lean PS's): each in a
process group of its own, its output read line by line, and all of it ended and reaped
whatever happens."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from trimtab.launch.procs import die_with_parent

__all__ = ["Job", "step_figures"]


class Job:
    """The processes of one job of a peer (its roles), their output, and their
    teardown. ``tag`` prefixes each line of :meth:`log`."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.lines: list[tuple[str, str]] = []
        self._readers: list[threading.Thread] = []
        self._lock = threading.Lock()

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str]) -> None:
        """Start ``argv`` (``name`` in the log) in a process group of its own, ended with
        this process if it is killed outright. Does not block."""
        popen = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group, killed whole on teardown
            preexec_fn=die_with_parent,
        )
        reader = threading.Thread(target=self._pump, args=(name, popen), daemon=True)
        reader.start()
        self.procs.append((name, popen))
        self._readers.append(reader)

    def _pump(self, name: str, popen: subprocess.Popen[bytes]) -> None:
        assert popen.stdout is not None
        for raw in iter(popen.stdout.readline, b""):
            with self._lock:
                self.lines.append((name, raw.decode(errors="replace").rstrip("\n")))

    def log(self, last: int = 30) -> str:
        """The last ``last`` lines the processes printed, each with its name."""
        with self._lock:
            return "\n".join(f"[{self.tag} {n}] {line}" for n, line in self.lines[-last:])

    def wait(self, names: Sequence[str], deadline: float) -> str | None:
        """Wait for the named processes to exit; return why it failed, or ``None``."""
        watched = [(n, p) for n, p in self.procs if n in names]
        while True:
            for n, p in self.procs:
                code = p.poll()
                if code is not None and code != 0:
                    return f"{n} exited with status {code}"
            if all(p.poll() is not None for _, p in watched):
                return None
            if time.monotonic() > deadline:
                return "timed out"
            time.sleep(0.05)

    def stop(self) -> None:
        """Terminate, then kill, every process group still alive; reap all. Never raises."""
        for _, p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline and any(p.poll() is None for _, p in self.procs):
            time.sleep(0.05)
        for _, p in self.procs:
            # Also whatever the process left in its group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for reader in self._readers:
            reader.join(timeout=2.0)

    def result(
        self, failed: str | None, timeout_s: float, marker: str, steps: int, label: str
    ) -> dict[str, Any]:
        """The one result line (``marker`` and JSON with ``times``) the job printed, once
        it ended; ``failed`` is what :meth:`wait` said. Raises RuntimeError, with the
        last lines printed and ``label`` (the job's name), if it failed or timed out,
        or did not print one result of ``steps`` times."""
        if failed is not None:
            what = f"timed out after {timeout_s:.0f}s" if failed == "timed out" else failed
            raise RuntimeError(f"{label} job {what}:\n{self.log()}")
        results = [
            json.loads(line[len(marker) :]) for _, line in self.lines if line.startswith(marker)
        ]
        if len(results) != 1 or len(results[0].get("times", ())) != steps:
            raise RuntimeError(f"{label} job gave no result:\n{self.log()}")
        out: dict[str, Any] = results[0]
        return out


def step_figures(times: Sequence[float]) -> dict[str, Any]:
    """``{"median_s", "p90_s", "steps"}`` of a job's step times. Never blocks."""
    return {
        "median_s": statistics.median(times),
        "p90_s": sorted(times)[int(0.9 * (len(times) - 1))],
        "steps": len(times),
    }
