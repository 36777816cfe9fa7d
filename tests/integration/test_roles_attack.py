"""Only the job's own processes, in their roles, may touch the job (issue 19).

A live job of real processes (``trimtab run``, two workers, two servers, room for a
third) is attacked mid-run from a peer that passes the transport's checks but holds no
role (:func:`tests.roles_attack.raw_client`): every attack is refused with an error
reply, every node stays up, nothing is held for the attacker, and the job's final
parameters are one process's over the same global batches (1e-5): what an unattacked run
gives (a forged push of NaNs, or any gradient taken, would change them).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.equivalence_job import Setup, max_difference, reference
from tests.roles_attack import raw_client
from trimtab.protocol.messages import Control, Data

SCRIPT = Path(__file__).with_name("attack_worker.py")
ATTACK_AT = 4  # rank 0 waits after this step while the job is attacked
MIB = 1 << 20


def _start(out: Path) -> subprocess.Popen[bytes]:
    out.mkdir()
    command = [sys.executable, "-m", "trimtab", "run", "-w", "2", "-s", "2"]
    command += ["--max-servers", "3", "--chunk-bytes", "8192", "--deadline", "150"]
    command += ["--", sys.executable, str(SCRIPT), str(out), str(ATTACK_AT)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _finish(proc: subprocess.Popen[bytes], out: Path) -> tuple[list[torch.Tensor], dict]:
    output, _ = proc.communicate(timeout=170)
    assert proc.returncode == 0, output.decode(errors="replace")[-4000:]
    params = torch.load(out / "rank0.pt")
    for got, want in zip(torch.load(out / "rank1.pt"), params, strict=True):
        assert torch.equal(got, want), "the workers disagree"
    return params, json.loads((out / "stats.json").read_text())


def _go(out: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while not (out / "job.json").exists():
        assert time.monotonic() < deadline, "the job never reached the attack"
        time.sleep(0.05)
    return json.loads((out / "job.json").read_text())


def _refused(reply: dict[str, Any], code: str) -> None:
    assert reply["o"] in (int(Data.ERROR), int(Control.ERROR)), reply
    assert reply["code"] == code, reply
    assert len(reply["msg"]) > 10, reply  # a sentence that says why


class Attacked:
    """What the attacked job answered, and how it ended."""

    def __init__(self) -> None:
        self.replies: dict[str, dict[str, Any]] = {}
        self.params: list[torch.Tensor] = []
        self.stats: dict[str, Any] = {}


def _attack(job: dict[str, Any], replies: dict[str, dict[str, Any]]) -> None:
    jid, epoch, clock = job["job"], job["epoch"], job["clock"]
    cid, numel, dtype, owner = job["chunks"][0]
    server = raw_client(job["servers"][owner], job["secret_file"])
    coordinator = raw_client(job["coordinator"], job["secret_file"])
    try:
        nan = torch.full((numel,), float("nan")).numpy().tobytes()
        base = {"j": jid, "c": cid, "e": epoch, "dt": dtype, "n": numel}
        # The seeding op, mid-run, with and without a worker's rank.
        replies["init"] = server.request({**base, "o": int(Data.INIT), "i": 1}, [nan])
        replies["init as root"] = server.request(
            {**base, "o": int(Data.INIT), "i": 2, "r": 0, "t": b"\0" * 16}, [nan]
        )
        # Worker 0's gradient for the clock the job is at.
        push = {**base, "o": int(Data.PUSH), "r": 0, "k": clock, "w": 12.0}
        replies["push as worker 0"] = server.request({**push, "i": 3}, [nan])
        replies["push, a made-up credential"] = server.request(
            {**push, "i": 4, "t": b"x" * 16}, [nan]
        )
        # Reading the job: a chunk's value and a server's counters.
        replies["pull"] = server.request({**base, "o": int(Data.PULL), "i": 5})
        replies["stats"] = server.request({"j": jid, "o": int(Data.STATS), "i": 6})
        replies["status"] = coordinator.request({"j": jid, "o": int(Control.STATUS), "i": 7})
        # A server slot the attacker asks for, then takes.
        replies["scale"] = coordinator.request(
            {"j": jid, "o": int(Control.SCALE), "i": 8, "servers": 3}
        )
        replies["register as a server"] = coordinator.request(
            {"j": jid, "o": int(Control.REGISTER), "i": 9, "role": "server", "addr": "tcp://x:1"}
        )
        # A member's op from a peer that is none.
        replies["map ack"] = coordinator.request(
            {"j": jid, "o": int(Control.MAP_ACK), "i": 10, "epoch": epoch}
        )
        # Twenty chunks "of a future map", 16 MiB each.
        big = bytes(16 * MIB)
        for n in range(20):
            handover = {
                "j": jid,
                "o": int(Data.HANDOVER),
                "i": 100 + n,
                "c": cid,
                "v": 1,
                "k": 1,
                "e": epoch + 5,
                "dt": "float32",
                "n": 4 * MIB,
                "p": [0, 0, 0],
                "s": 1 - owner,
                "t": b"\0" * 16,
            }
            replies[f"handover {n}"] = server.request(handover, [big])
    finally:
        server.close()
        coordinator.close()


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attacked]:
    """The attacked job; the attack mid-run."""
    root = tmp_path_factory.mktemp("roles")
    result = Attacked()
    hit_out = root / "attacked"
    hit = _start(hit_out)
    try:
        _attack(_go(hit_out), result.replies)
        (hit_out / "go").touch()
        result.params, result.stats = _finish(hit, hit_out)
    finally:
        if hit.poll() is None:
            hit.kill()
            hit.wait()
    yield result


def _unharmed(attacked: Attacked) -> None:
    expected = reference(Setup("adam", (12, 12), hidden=192))  # attack_worker.py's job
    assert max_difference(attacked.params, expected) < 1e-5, "the attack changed the model"
    for s in attacked.stats["servers"]:
        assert s["early"] == 0 and s["early_bytes"] == 0, s  # nothing held


@pytest.mark.timeout(300)
def test_init_mid_run_is_refused(attacked: Attacked) -> None:
    _refused(attacked.replies["init"], "forbidden")
    _refused(attacked.replies["init as root"], "forbidden")
    _unharmed(attacked)


@pytest.mark.timeout(300)
def test_a_push_forged_as_worker_0_is_refused(attacked: Attacked) -> None:
    _refused(attacked.replies["push as worker 0"], "forbidden")
    _refused(attacked.replies["push, a made-up credential"], "forbidden")
    _unharmed(attacked)


@pytest.mark.timeout(300)
def test_scale_then_register_admits_no_outsider(attacked: Attacked) -> None:
    # SCALE is a tool's op: an authenticated client may ask. The slot it opens is for a
    # server the launcher starts (it holds the join ticket), not for the asker.
    assert attacked.replies["scale"]["o"] == int(Control.OK)
    _refused(attacked.replies["register as a server"], "forbidden")
    _refused(attacked.replies["map ack"], "bad_state")
    job = attacked.stats["job"]
    assert "tcp://x:1" not in job["servers"]
    assert job["wanted_servers"] == 3  # the slot stays the launcher's to fill
    _unharmed(attacked)


@pytest.mark.timeout(300)
def test_an_unregistered_peer_reads_nothing_from_servers(attacked: Attacked) -> None:
    _refused(attacked.replies["pull"], "forbidden")
    _refused(attacked.replies["stats"], "forbidden")
    # STATUS is a tool's (trimtab scale, the launcher): answered to an authenticated
    # client, and it carries no credential.
    status = attacked.replies["status"]
    assert status["o"] == int(Control.OK)
    assert not [k for k in status if k in ("t", "key", "tk")]
    _unharmed(attacked)


@pytest.mark.timeout(300)
def test_future_handovers_are_neither_held_nor_taken(attacked: Attacked) -> None:
    for n in range(20):
        _refused(attacked.replies[f"handover {n}"], "forbidden")
    _unharmed(attacked)
