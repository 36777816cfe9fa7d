"""The MXNet peer's launcher, without MXNet: loopback-only settings, the skip path, and
process handling with a stand-in interpreter (a few seconds in all)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trimtab_tools.bench import datapath, mxnet_peer
from trimtab_tools.bench._mxnet_worker import RESULT
from trimtab_tools.bench._venv import MARKER, ToolUnavailable, ensure_venv

LOOPBACK = "127.0.0.1"


@pytest.mark.parametrize("role", ["scheduler", "server", "worker"])
def test_role_env_keeps_every_role_on_loopback(role: str) -> None:
    base = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/somewhere/trimtab",
        "VIRTUAL_ENV": "/work/main/.venv",
        # Inherited from an outer job: must not leak into the peer's processes.
        "DMLC_PS_ROOT_URI": "10.1.2.3",
        "DMLC_NODE_HOST": "192.168.1.7",
        "DMLC_INTERFACE": "eth0",
        "DMLC_WORKER_ID": "3",
        "PS_VERBOSE": "2",
    }
    env = mxnet_peer.role_env(role, 40123, servers=2, workers=2, base=base)
    assert env["DMLC_ROLE"] == role
    assert env["DMLC_PS_ROOT_URI"] == LOOPBACK
    assert env["DMLC_NODE_HOST"] == LOOPBACK
    assert env["DMLC_INTERFACE"] == "lo"
    assert env["DMLC_PS_ROOT_PORT"] == "40123"
    assert (env["DMLC_NUM_SERVER"], env["DMLC_NUM_WORKER"]) == ("2", "2")
    assert "DMLC_WORKER_ID" not in env and "PS_VERBOSE" not in env
    assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env
    assert env["PATH"] == "/usr/bin"
    # No address other than loopback anywhere in the peer's settings.
    for key, value in env.items():
        if key.startswith("DMLC_") and "." in value:
            assert value == LOOPBACK, key


def test_role_env_local_mode_is_asked_for_only() -> None:
    """DMLC_LOCAL=1 (ps-lite over Unix-domain sockets) only for the one-machine run; an
    inherited one is dropped like every other DMLC_ setting."""
    base = {"DMLC_LOCAL": "1"}
    assert "DMLC_LOCAL" not in mxnet_peer.role_env("worker", 40123, servers=2, workers=2, base=base)
    env = mxnet_peer.role_env("server", 40123, servers=2, workers=2, base={}, local=True)
    assert env["DMLC_LOCAL"] == "1" and env["DMLC_PS_ROOT_URI"] == LOOPBACK


def test_role_env_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="role"):
        mxnet_peer.role_env("master", 40123, servers=2, workers=2, base={})
    with pytest.raises(ValueError, match="port"):
        mxnet_peer.role_env("server", 0, servers=2, workers=2, base={})


def test_without_mxnet_and_no_install_the_peer_is_skipped_with_a_reason(tmp_path: Path) -> None:
    venv = tmp_path / "mxnet-venv"
    with pytest.raises(ToolUnavailable, match="installing was not allowed"):
        mxnet_peer.mxnet_python(venv, install=False)
    result, why = datapath._mxnet([1 << 20], 20, venv, install=False)
    assert result is None
    assert why is not None and why.startswith("MXNet unavailable:") and str(venv) in why
    assert list(tmp_path.iterdir()) == []  # nothing made, not even a lock file


def test_a_folder_trimtab_did_not_make_is_left_alone(tmp_path: Path) -> None:
    theirs = tmp_path / "their-venv"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(ToolUnavailable, match="was not made by trimtab"):
        ensure_venv(theirs, ("mxnet==1.9.1",), "import mxnet", install=True)
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    assert not (theirs / MARKER).exists()


def _fake_python(tmp_path: Path, worker_body: str) -> Path:
    """An interpreter stand-in: ``-c ...`` (scheduler, server) exits at once; a script
    path (a worker) runs ``worker_body`` with the real Python instead."""
    worker = tmp_path / "fake_worker.py"
    worker.write_text(worker_body)
    fake = tmp_path / f"fake-python-{uuid.uuid4().hex[:8]}"
    fake.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exit 0; fi\nexec {sys.executable} {worker} "$@"\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _left(token: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", token], capture_output=True, text=True, check=False)
    return [line for line in out.stdout.splitlines() if "pgrep" not in line]


@pytest.mark.timeout(60)
def test_run_mxnet_collects_the_rank0_result(tmp_path: Path) -> None:
    body = f"""
import json, os, sys
assert os.environ["DMLC_ROLE"] == "worker" and os.environ["DMLC_INTERFACE"] == "lo"
try:  # the first worker to get here plays ps-lite's rank 0
    os.close(os.open({str(tmp_path / "rank0")!r}, os.O_CREAT | os.O_EXCL))
except FileExistsError:
    sys.exit(0)
steps = int(sys.argv[sys.argv.index("--steps") + 1])
times = [0.1 + 0.01 * i for i in range(steps)]
print({RESULT!r} + json.dumps({{"times": times, "version": "fake", "bigarray_bound": 1000000}}))
"""
    fake = _fake_python(tmp_path, body)
    r = mxnet_peer.run_mxnet(fake, [1 << 20, 2 << 20], 5, warmup=1, timeout_s=30)
    assert r["steps"] == 5 and r["median_s"] == pytest.approx(0.12)
    assert r["version"] == "fake" and r["bigarray_bound"] == 1_000_000
    assert _left(fake.name) == []


@pytest.mark.timeout(60)
def test_run_mxnet_kills_a_hung_job_and_says_so(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path, "import time\nprint('stuck', flush=True)\ntime.sleep(600)\n")
    with pytest.raises(RuntimeError, match=r"timed out after 2s(.|\n)*stuck"):
        mxnet_peer.run_mxnet(fake, [1 << 20], 3, timeout_s=2)
    assert _left(fake.name) == []
    assert _left(str(tmp_path / "fake_worker.py")) == []


@pytest.mark.timeout(60)
def test_run_mxnet_reports_a_failed_worker(tmp_path: Path) -> None:
    fake = _fake_python(tmp_path, "import sys\nprint('boom', flush=True)\nsys.exit(3)\n")
    with pytest.raises(RuntimeError, match=r"exited with status 3(.|\n)*boom"):
        mxnet_peer.run_mxnet(fake, [1 << 20], 3, timeout_s=30)
    assert _left(str(tmp_path / "fake_worker.py")) == []


def test_default_venv_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIMTAB_MXNET_VENV", "/opt/mx")
    assert mxnet_peer.default_venv() == Path("/opt/mx")
    monkeypatch.delenv("TRIMTAB_MXNET_VENV")
    monkeypatch.setenv("TRIMTAB_CACHE_DIR", "/var/cache/tt")
    assert mxnet_peer.default_venv() == Path("/var/cache/tt/mxnet-venv")
    assert os.environ.get("TRIMTAB_MXNET_VENV") is None


def test_role_env_on_a_bed_host_uses_that_hosts_address_and_interface() -> None:
    """``bench datapath --testbed --peers mxnet``: each ps-lite process advertises its
    own bed host's address on the host's ``eth0`` and finds the scheduler at its host's."""
    env = mxnet_peer.role_env(
        "server",
        40123,
        servers=2,
        workers=2,
        base={"DMLC_NODE_HOST": "192.168.1.7"},
        host="10.77.3.2",
        root="10.77.3.1",
        interface="eth0",
    )
    assert (env["DMLC_NODE_HOST"], env["DMLC_PS_ROOT_URI"]) == ("10.77.3.2", "10.77.3.1")
    assert env["DMLC_INTERFACE"] == "eth0"
