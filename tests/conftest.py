"""Shared test helpers: a whole cluster in one process, and process hygiene checks."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trimtab import Context, Coordinator, CoordinatorConfig, Server, ServerConfig, WorkerConfig
from trimtab.faults.stragglers import parse_stragglers
from trimtab.frontend.api import add_stragglers
from trimtab.transport import Fabric, Transport
from trimtab.transport.shm import turned_off as shm_turned_off


class Cluster:
    """A coordinator and servers running as threads, on the in-process fabric (``inproc``)
    or on real loopback TCP sockets (``tcp``)."""

    def __init__(
        self,
        workers: int,
        servers: int,
        transport: str,
        stragglers: tuple[str, ...] = (),
        **coord: Any,
    ) -> None:
        self.job = uuid.uuid4().hex[:8]
        self.stragglers = parse_stragglers(stragglers)
        self.workers = workers
        self.fabric = Fabric() if transport == "inproc" else None
        self.coordinator = Coordinator(
            CoordinatorConfig(num_workers=workers, num_servers=servers, job=self.job, **coord),
            self._transport(bind=True),
        )
        self.threads = [self.coordinator.start()]
        self.servers = [
            Server(
                ServerConfig(coordinator=self.coordinator.address, job=self.job),
                self._transport(bind=True),
            )
            for _ in range(servers)
        ]
        self.threads += [s.start() for s in self.servers]

    def _transport(self, bind: bool) -> Transport | None:
        return self.fabric.transport(bind=bind) if self.fabric else None

    def context(self, rank: int) -> Context:
        """Worker ``rank``'s context, wired as ``trimtab.init()`` wires one (its
        stragglers as a step hook, ``TRIMTAB_SHM`` read here, at the edge)."""
        ctx = Context(
            WorkerConfig(
                coordinator=self.coordinator.address,
                job=self.job,
                rank=rank,
                request_timeout_s=30.0,
                shared_memory=not shm_turned_off(os.environ),
            ),
            transport=self._transport(bind=False),
        )
        add_stragglers(ctx, self.stragglers)
        return ctx

    def run_workers(self, fn: Callable[[Context], Any], timeout_s: float = 60.0) -> list[Any]:
        """Run ``fn(ctx)`` in one thread per worker; return the results by rank; re-raise
        the first worker error."""
        results: list[Any] = [None] * self.workers
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            ctx = self.context(rank)
            try:
                results[rank] = fn(ctx)
            except BaseException as exc:
                errors.append(exc)
                ctx.client.close(done=False)
                self.coordinator.abort(f"worker {rank} failed in the test: {exc!r}")
                return
            ctx.close()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s)
        if errors:
            raise errors[0]
        assert not any(t.is_alive() for t in threads), "workers did not finish in time"
        return results

    def close(self) -> None:
        self.coordinator.abort("test over")
        for s in self.servers:
            s.stop()
        for t in self.threads:
            t.join(10)


@pytest.fixture(scope="session", autouse=True)
def _working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run every test in a temporary working directory, so that what jobs write by
    default under it (``runs/<job id>/``, ``trimtab-checkpoints/``) is not left in the
    checkout. Tests name their files by ``__file__``, never by the working directory."""
    before = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(before)


@pytest.fixture
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(
        workers: int = 2,
        servers: int = 2,
        transport: str = "inproc",
        stragglers: tuple[str, ...] = (),
        **coord: Any,
    ) -> Cluster:
        c = Cluster(workers, servers, transport, stragglers, **coord)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def processes_of(job: str) -> list[str]:
    """Command lines of the live processes of job ``job`` (none should outlive it): those
    the launcher gave it by name (``--job ID``: the coordinator and servers) or in their
    environment (``TRIMTAB_JOB=ID``: the workers, and what they started). Exact: a
    process of another job or test, or one whose command line merely contains the
    string, is not counted."""
    return processes_with(arg=job, env=f"TRIMTAB_JOB={job}")


def processes_with(arg: str, env: str | None = None) -> list[str]:
    """Command lines of live processes (this one aside) with ``arg`` as one of their
    arguments, or ``env`` as one entry of their environment."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0") if env else []
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if arg.encode() in argv or (env is not None and env.encode() in environ):
            found.append(b" ".join(argv).decode(errors="replace").strip())
    return found
