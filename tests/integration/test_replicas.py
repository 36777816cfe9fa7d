"""Server replicas over real processes: a server SIGKILLed mid-training under
``--replicas 1`` loses nothing (its chunks' backups take over, the workers resend what
it left unanswered, applied once), and the job ends with one process's parameters.
Without replicas, the job ends with a message naming the chunks lost."""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import STEPS, Setup, max_difference, reference
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.testbed import Testbed

SCRIPT = Path(__file__).with_name("replica_worker.py")

#: Silence after which the coordinator takes a member for dead (servers report their
#: load every 0.25 s, workers heartbeat every second): short, so the test is.
DEAD_AFTER_S = "3"


def _run_and_kill(
    config: LaunchConfig,
    sizes: tuple[int, ...],
    out: Path,
    victims: dict[int, str],
    optimizer: str = "sgd",
    env: dict[str, str] | None = None,
    before_kill: Callable[[Job, int, list[str]], None] | None = None,
    testbed: Testbed | None = None,
) -> tuple[int, list[str]]:
    """Run the replica job; after each step of ``victims`` (step: process, e.g.
    "server 1"), when rank 0 asks (OUT/kill<n>), SIGKILL that process and say so
    (OUT/killed<n>); ``before_kill(job, n, output)`` first, if given. On ``testbed``'s
    hosts if given. Returns the job's status and output."""
    lines: list[str] = []
    config = dataclasses.replace(config, deadline_s=100.0)
    steps = ",".join(map(str, victims))
    command = [sys.executable, str(SCRIPT), optimizer, ",".join(map(str, sizes)), str(out), steps]
    job = Job(
        config,
        command,
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={"TRIMTAB_DEAD_AFTER_S": DEAD_AFTER_S, **(env or {})},
        testbed=testbed,
    )
    status: list[int] = []
    runner = threading.Thread(target=lambda: status.append(job.run()), daemon=True)
    runner.start()
    for n, victim in enumerate(victims.values()):
        deadline = time.monotonic() + 60
        while not (out / f"kill{n}").exists() and runner.is_alive():
            assert time.monotonic() < deadline, "\n".join(lines[-60:])
            time.sleep(0.02)
        if not runner.is_alive():
            break
        if before_kill is not None:
            before_kill(job, n, lines)
        procs = [p for p in job._procs if p.source == victim]
        assert procs, f"no {victim} among {[p.source for p in job._procs]}"
        procs[0].handle.signal(signal.SIGKILL)
        (out / f"killed_at{n}").write_text(str(time.time()))
        procs[0].handle.wait()
        (out / f"killed{n}").write_text(victim)
    runner.join(110)
    assert status, "the job did not end"
    return status[0], lines


KILLS = [
    # (optimizer, servers, {after step: the server process killed}, rank 0 waits for it,
    #  --rebalance-every: forced migrations of every chunk, moving roles)
    ("sgd", 3, {7: "server 1"}, True, 0),
    ("adam", 3, {4: "server 2", 12: "server 0"}, True, 0),  # replicas re-created, then lost
    ("sgd", 3, {5: "server 0"}, False, 0),  # killed while rounds and replications fly
    ("adam", 3, {}, False, 2),  # every chunk's roles move every 2 steps: nothing lost
    ("sgd", 3, {9: "server 2"}, False, 3),  # migrations, a death, migrations again
]
#: The case the default run takes (a death between steps); the others, a death while
#: rounds fly among them (14 to 20 s), run in the slow tier (`pytest -m slow`, which
#: .ci/run runs too).
DEFAULT = (0,)


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    ("optimizer", "servers", "victims", "waits", "rebalance"),
    [
        pytest.param(
            o,
            s,
            v,
            w,
            r,
            id=f"{o}-{s}s-{len(v)}kills{'' if w else '-flying'}{f'-moves{r}' if r else ''}",
            marks=() if n in DEFAULT else pytest.mark.slow,
        )
        for n, (o, s, v, w, r) in enumerate(KILLS)
    ],
)
def test_servers_killed_mid_training_lose_nothing_with_replicas(
    tmp_path: Path,
    optimizer: str,
    servers: int,
    victims: dict[int, str],
    waits: bool,
    rebalance: int,
) -> None:
    sizes = (5, 19)
    config = LaunchConfig(
        workers=2, servers=servers, chunk_bytes=512, replicas=1, rebalance_every=rebalance
    )
    env = None if waits else {"REPLICA_NOWAIT": "1"}
    status, lines = _run_and_kill(config, sizes, tmp_path, victims, optimizer, env)
    assert status == 0, "\n".join(lines[-60:])
    expected = reference(Setup(optimizer, sizes))
    for rank in range(len(sizes)):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert max_difference(got, expected) < 1e-5, f"rank {rank} diverged"
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert len(stats["servers"]) == servers - len(victims)  # the live ones
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    # Every chunk took every step's update exactly once: none lost, none twice.
    assert versions and all(v == STEPS for v in versions), versions
    assert sorted(int(c) for s in stats["servers"] for c in s["versions"]) == list(
        range(len(stats["job"]["owners"]))
    )
    # Kept in step through shared memory (one machine), and promoted on each death.
    assert all(s["replicated_shared"] > 0 for s in stats["servers"])
    assert sum(s["promoted"] for s in stats["servers"]) > 0
    live = {s["index"] for s in stats["servers"]}
    assert set(stats["job"]["owners"]) <= live  # the dead servers own nothing
    assert sum("its backups take over" in line for line in lines) == len(victims)
    if rebalance:  # roles moved, never bytes: each chunk onto its backup
        assert stats["job"]["migrations"] >= 2, stats["job"]
        assert all(s["moved_in"] == 0 for s in stats["servers"])  # no HANDOVER
        assert sum(s["promoted"] for s in stats["servers"]) > len(victims)
    # From each kill to the next step either worker completed (reported, not asserted:
    # it is TRIMTAB_DEAD_AFTER_S, the silence that declares a server dead, and more).
    ends = sorted(t for r in (0, 1) for t in json.loads((tmp_path / f"steps{r}.json").read_text()))
    for n in range(len(victims)):
        killed = float((tmp_path / f"killed_at{n}").read_text())
        print(f"recovery after kill {n}: {min(t for t in ends if t > killed) - killed:.2f} s")
    assert processes_of(config.job) == []


@pytest.mark.slow  # (two deaths, two replacements: 15 to 23 s; the slow tier runs it)
@pytest.mark.timeout(150)
def test_after_two_failovers_replacements_restore_the_replication(tmp_path: Path) -> None:
    """Two servers: each death leaves every chunk on one server, held once, and the
    launcher starts a replacement, which the coordinator gives every chunk's backup.
    The second death is survivable only if the first was made good: the job ends with
    one process's parameters, saying both times that it ran with fewer copies."""
    seen: list[dict[str, object]] = []

    def restored(job: Job, n: int, job_lines: list[str]) -> None:
        if n == 0:
            return
        deadline = time.monotonic() + 60
        while True:
            reply = job._status()
            settled = reply is not None and not reply["migrating"]
            if settled and reply["failovers"] == 1 and reply["unbacked"] == 0:
                seen.append(dict(reply))
                return
            said = "\n".join(job_lines[-80:])
            assert time.monotonic() < deadline, f"not restored: {reply}\n{said}"
            time.sleep(0.1)

    sizes = (5, 19)
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512, replicas=1)
    victims = {4: "server 1", 12: "server 0"}
    status, lines = _run_and_kill(config, sizes, tmp_path, victims, before_kill=restored)
    text = "\n".join(lines)
    assert status == 0, text[-6000:]
    expected = reference(Setup("sgd", sizes))
    for rank in range(len(sizes)):
        assert max_difference(torch.load(tmp_path / f"rank{rank}.pt"), expected) < 1e-5
    # Restored after the first death: each chunk on one of the two live servers (the
    # survivor, the replacement), its backup on the other.
    (before_second,) = seen
    owners, backups = before_second["owners"], before_second["backups"]
    live = before_second["live_servers"]
    assert isinstance(owners, list) and isinstance(backups, list) and isinstance(live, list)
    assert len(live) == 2 and 2 in live  # (server 2: the replacement, by either count)
    pairs = zip(owners, backups, strict=True)
    assert all(o in live and b in live and b != o for o, b in pairs), before_second
    assert "starting server 2" in text and "starting server 1" not in text, text[-4000:]
    assert text.count("running with fewer copies than asked") >= 2, text[-4000:]
    assert "replication restored" in text, text[-4000:]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert stats["job"]["failovers"] == 2
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    assert versions and all(v == STEPS for v in versions), versions  # each update once
    assert processes_of(config.job) == []


@pytest.mark.slow  # (a kill timed to a migration: 13 to 23 s; the slow tier runs it)
@pytest.mark.timeout(150)
def test_a_server_killed_as_a_migration_reaches_it_loses_nothing(tmp_path: Path) -> None:
    """Every 2 steps each chunk's roles move (onto its backup, or a new backup filled).
    Server 0 dies as a MIGRATE reaches it, before it takes it; the other servers take
    that map, dropping copies it moved away. The coordinator gives the migration up,
    asks the live servers what they hold (a server keeps what a map took from it until
    the next), and promotes each chunk's newest copy: nothing is lost, nothing applied
    twice."""
    sizes = (5, 19)
    config = LaunchConfig(
        workers=2,
        servers=3,
        chunk_bytes=512,
        replicas=1,
        rebalance_every=2,
        faults=("server:0:kill@5:migrating",),
    )
    status, lines = _run_and_kill(config, sizes, tmp_path, {}, env={"REPLICA_NOWAIT": "1"})
    text = "\n".join(lines)
    assert status == 0, text[-6000:]
    assert "was killed by --fault server:0:kill@5:migrating" in text, text[-6000:]
    assert "asking the 2 live servers which copies they hold" in text, text[-6000:]
    assert "go to the newest copies" in text, text[-6000:]
    expected = reference(Setup("sgd", sizes))
    for rank in range(len(sizes)):
        assert max_difference(torch.load(tmp_path / f"rank{rank}.pt"), expected) < 1e-5
    stats = json.loads((tmp_path / "stats.json").read_text())
    versions = [v for s in stats["servers"] for v in s["versions"].values()]
    assert versions and all(v == STEPS for v in versions), versions  # each update once
    assert stats["job"]["failovers"] == 1
    assert processes_of(config.job) == []


@pytest.mark.timeout(150)
def test_without_replicas_a_dead_server_ends_the_job_naming_its_chunks(tmp_path: Path) -> None:
    config = LaunchConfig(workers=2, servers=2, chunk_bytes=512)
    status, lines = _run_and_kill(config, (12, 12), tmp_path, {7: "server 1"})
    assert status != 0
    text = "\n".join(lines)
    assert "server 1 exited with status" in text, text[-3000:]
    assert processes_of(config.job) == []
