"""Pushes and values through a worker's shared memory (``trimtab.transport.shm``), over real
loopback sockets with the roles as threads: one process's parameters either way, a
fallback to the sockets when a server cannot map the arena, and the arena's own checks.
(The multi-process equivalence tests cover the server-mode path between processes.)"""

from __future__ import annotations

import os

import pytest

import trimtab.roles.server.slots
from tests.equivalence_job import Setup, max_difference, reference, train_worker
from trimtab.transport.shm import SHM_DIR, Arena, is_local, job_prefix

# Weights of 7.5 and 12 KiB cut at 8 KiB: three chunks too big to ride inside a header.
HIDDEN = 192
BIG_CHUNKS = 3


def train(cluster_factory, setup: Setup) -> int:
    """Train ``setup`` on 2 workers x 2 servers over TCP; check both workers end with
    one process's parameters and nothing is left in /dev/shm; return how many pushes
    the servers took from shared memory."""
    cluster = cluster_factory(workers=2, servers=2, transport="tcp", chunk_bytes=8192)
    results = cluster.run_workers(lambda ctx: train_worker(setup, ctx.rank, ctx))
    expected = reference(setup)
    for rank, got in enumerate(results):
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    assert list(SHM_DIR.glob(job_prefix(cluster.job) + "*")) == []  # removed on close
    return sum(s.stats()["shared"] for s in cluster.servers)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shm", [True, False], ids=["shm", "sockets"])
def test_summation_mode_through_shared_memory_or_sockets(
    cluster_factory, monkeypatch: pytest.MonkeyPatch, shm: bool
) -> None:
    """Summation mode: the reply, the averaged gradient, lands in the push's slot."""
    monkeypatch.setenv("TRIMTAB_SHM", "1" if shm else "0")
    setup = Setup("sgd-sum", (5, 19), hidden=HIDDEN)
    assert train(cluster_factory, setup) == (BIG_CHUNKS * 2 * setup.steps if shm else 0)


@pytest.mark.timeout(120)
def test_a_server_that_cannot_map_the_arena_is_sent_bytes(
    cluster_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server on another machine (or in another /dev/shm) answers ``no_shm``; the
    worker resends that push as bytes and sends that server bytes from then on."""
    refusals: list[str] = []

    def cannot_map(name: str) -> Arena:
        refusals.append(name)
        raise FileNotFoundError(2, "No such file or directory", name)

    monkeypatch.setattr(trimtab.roles.server.slots.Arena, "attach", cannot_map)
    monkeypatch.setenv("TRIMTAB_SHM", "1")
    assert train(cluster_factory, Setup("adam", (5, 19), hidden=HIDDEN)) == 0
    # Refused: the big chunks' pushes sent before the first refusal came back (the
    # first step's), each resent as bytes; none after.
    assert 1 <= len(refusals) <= 2 * BIG_CHUNKS, refusals


def test_arena_bounds_names_and_removal() -> None:
    job = f"arenatest{os.getpid()}"
    arena = Arena.create(job, "w0", 1000)
    try:
        assert (SHM_DIR / arena.name).exists() and arena.name.startswith(job_prefix(job))
        arena.view(0, 10)[:] = b"0123456789"
        other = Arena.attach(arena.name)  # as a server maps it
        assert bytes(other.view(0, 10)) == b"0123456789"
        other.view(990, 10)[:] = b"x" * 10
        assert bytes(arena.view(990, 10)) == b"x" * 10
        for offset, nbytes in ((-1, 4), (999, 2), (0, 1001)):
            with pytest.raises(ValueError, match="outside arena"):
                other.view(offset, nbytes)
        other.close()  # a server's close leaves the worker's arena in place
        assert (SHM_DIR / arena.name).exists()
    finally:
        arena.close()
    assert not (SHM_DIR / arena.name).exists()
    with pytest.raises(ValueError, match="not the name"):
        Arena.attach("../etc/passwd")
    with pytest.raises(FileNotFoundError):
        Arena.attach(arena.name)


def test_a_full_dev_shm_fails_at_creation_not_on_a_write() -> None:
    """Room is reserved up front: more than /dev/shm can hold raises OSError (and leaves
    nothing behind) instead of a SIGBUS at the first write past the limit."""
    job = f"fulltest{os.getpid()}"
    fs = os.statvfs(SHM_DIR)
    with pytest.raises(OSError):
        Arena.create(job, "w0", fs.f_blocks * fs.f_frsize + (1 << 20))
    assert list(SHM_DIR.glob(job_prefix(job) + "*")) == []


@pytest.mark.parametrize(
    ("address", "local"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.3.2.1:1", True),
        ("tcp://localhost:9000", True),
        ("tcp://[::1]:9000", True),
        ("tcp://10.0.0.7:9000", False),
        ("tcp://example.org:9000", False),
    ],
)
def test_only_loopback_servers_are_offered_shared_memory(address: str, local: bool) -> None:
    assert is_local(address) is local
