"""Checkpoints over real processes: a BSP job killed after a checkpoint and resumed from
it ends with the parameters of a job never interrupted; ``trimtab checkpoint`` makes a
running job write a complete one; a half-written one is refused on resume."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import processes_of
from tests.equivalence_job import STEPS, Setup, max_difference, reference
from tests.integration.test_equivalence import SCRIPT, _run
from trimtab.launch.job import LaunchConfig
from trimtab.roles.coordinator.manifest import MANIFEST, find_checkpoint
from trimtab.roles.server.checkpoint import read_file
from trimtab.settings import CheckpointSettings
from trimtab.transport.shm import remove_job_arenas

TRIMTAB = [sys.executable, "-m", "trimtab"]
HINT = re.compile(r"job (\w+): a checkpoint now: (trimtab checkpoint .*)$", re.M)


def _start(tmp_path: Path, out: Path, *flags: str, step_s: float) -> subprocess.Popen[bytes]:
    """``trimtab run`` of the equivalence job (2 workers of 5 and 19 samples, 2 servers),
    each step at least ``step_s`` long, its output in ``tmp_path / "log"``."""
    out.mkdir()
    command = [sys.executable, str(SCRIPT), "sgd", "5,19", str(out)]
    return subprocess.Popen(
        [
            *TRIMTAB,
            "run",
            "-w",
            "2",
            "-s",
            "2",
            "--chunk-bytes",
            "512",
            "--deadline",
            "100",
            *flags,
            "--",
            *command,
        ],
        stdout=(tmp_path / "log").open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "EQUIV_STEP_S": str(step_s)},
        start_new_session=True,
    )


def _wait_for(what: str, found: object, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not found():  # type: ignore[operator]
        assert proc.poll() is None, f"the job ended before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in 60s:\n{log.read_text()[-3000:]}"
        time.sleep(0.02)


def _gone(job: str) -> None:
    deadline = time.monotonic() + 20
    while processes_of(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    remove_job_arenas(job)  # a worker killed outright cannot remove its own
    assert processes_of(job) == []


def kill_after_a_checkpoint(proc: subprocess.Popen[bytes], ckpts: Path, log: Path) -> None:
    """Once the ``trimtab run`` of ``proc`` (its output in ``log``) has a complete
    checkpoint in ``ckpts``, SIGKILL it and wait until no process of its job is left."""
    try:
        _wait_for("checkpoint", lambda: list(ckpts.glob(f"ckpt-*/{MANIFEST}")), proc, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher; its processes follow it
        proc.wait()
    hint = HINT.search(log.read_text())
    assert hint is not None, log.read_text()
    _gone(hint.group(1))


@pytest.mark.slow  # (a kill and a resume, 20 to 28 s; test_state_recipes resumes by default)
@pytest.mark.timeout(180)
def test_a_killed_bsp_job_resumed_from_its_checkpoint_matches_one_never_stopped(
    tmp_path: Path,
) -> None:
    ckpts, log = tmp_path / "ckpts", tmp_path / "log"
    proc = _start(
        tmp_path,
        tmp_path / "first",
        "--checkpoint-every",
        "4",
        "--checkpoint-dir",
        str(ckpts),
        step_s=0.15,
    )
    kill_after_a_checkpoint(proc, ckpts, log)
    assert not (tmp_path / "first" / "rank0.pt").exists(), "the job ended before it was killed"
    good = find_checkpoint(ckpts)
    manifest = json.loads((good / MANIFEST).read_text())
    clock = manifest["clock"]
    assert 4 <= clock < STEPS
    assert set(manifest["sums"]) == set(manifest["files"]) and manifest["check"]
    # A newer checkpoint beside it with one bit flipped in a server's file: passed over,
    # said so, and the job resumes from the intact one.
    flipped = _corrupt_copy(good, ckpts / "ckpt-99999999", "flip")

    second = tmp_path / "second"
    second.mkdir()
    config = LaunchConfig(
        workers=2, servers=2, chunk_bytes=512, checkpoint=CheckpointSettings(resume=str(ckpts))
    )
    lines = _run(config, [sys.executable, str(SCRIPT), "sgd", "5,19", str(second)])
    passed = [line for line in lines if "--resume: passed over ckpt-99999999" in line]
    assert passed and flipped in passed[0] and "corrupt, truncated or replaced" in passed[0]
    expected = reference(Setup("sgd", (5, 19)))
    for rank in range(2):
        assert max_difference(torch.load(second / f"rank{rank}.pt"), expected) < 1e-5
        # It went on from the checkpoint's clock: only the steps after it were run.
        assert len(torch.load(second / f"sizes{rank}.pt")) == STEPS - clock
    assert processes_of(config.job) == []


@pytest.mark.timeout(180)
def test_trimtab_checkpoint_makes_a_running_job_write_a_complete_checkpoint(
    tmp_path: Path,
) -> None:
    ckpts, log = tmp_path / "ckpts", tmp_path / "log"
    proc = _start(tmp_path, tmp_path / "out", "--checkpoint-dir", str(ckpts), step_s=0.25)
    try:
        _wait_for("hint", lambda: HINT.search(log.read_text()), proc, log)
        hint = HINT.search(log.read_text())
        assert hint is not None
        asked = subprocess.run(
            [*TRIMTAB, *hint.group(2).split()[1:]],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert asked.returncode == 0, asked.stderr
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    _gone(hint.group(1))
    written = re.search(r"checkpoint at step (\d+) written to (\S+)", asked.stdout)
    assert written is not None, asked.stdout
    directory = Path(written.group(2))
    assert directory.parent == ckpts
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["clock"] == int(written.group(1)) <= STEPS
    chunks = [c for f in manifest["files"] for c in read_file(directory / f)]
    assert sorted(chunks) == list(range(len(manifest["map"]["owners"])))  # each once
    assert all(not p.name.startswith(".") for p in directory.iterdir())  # no temporary left


def _corrupt_copy(good: Path, to: Path, how: str) -> str:
    """A copy of checkpoint ``good`` at ``to``, broken ``how``: one bit flipped in a
    server's file, that file cut short, or one digit of the manifest's clock changed (the
    JSON still reads); returns the name of what was broken."""
    shutil.copytree(good, to)
    if how == "manifest":
        path = to / MANIFEST
        text = path.read_text()
        clock = json.loads(text)["clock"]
        path.write_text(text.replace(f'"clock": {clock}', f'"clock": {clock + 1}', 1))
        return MANIFEST
    name = sorted(json.loads((to / MANIFEST).read_text())["files"])[0]
    data = bytearray((to / name).read_bytes())
    if how == "flip":
        data[len(data) // 2] ^= 0x10
    else:
        del data[len(data) // 2 :]
    (to / name).write_bytes(bytes(data))
    return name


def test_a_corrupt_truncated_or_altered_checkpoint_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    """A checkpoint as a job writes one (a server's file by the server's own writer, the
    manifest sealed as the coordinator seals it), then broken three ways: each named
    with --resume is refused by the launcher with status 2 before any role starts,
    saying what differs and naming the checkpoint beside it that may be chosen."""
    from trimtab.roles.server.checkpoint import write_file
    from trimtab.runtime.files import seal, write_atomic

    good = tmp_path / "ckpts" / "ckpt-00000004"
    good.mkdir(parents=True)
    digest = write_file(good / "server-0.chunks", 4, 0, [])
    manifest = {
        "format": 1,
        "job": "j",
        "clock": 4,
        "files": ["server-0.chunks"],
        "chunks": 0,
        "tables": [],
        "chunk_bytes": 512,
        "map": {},
        "sums": {"server-0.chunks": digest},
    }
    write_atomic(good / MANIFEST, [json.dumps(seal(manifest), indent=1).encode()])
    for how, says in (
        ("flip", "server-0.chunks"),
        ("cut", "server-0.chunks"),
        ("manifest", "does not match its checksum"),
    ):
        broken = tmp_path / "ckpts" / f"ckpt-0000001{len(how)}"
        _corrupt_copy(good, broken, how)
        proc = subprocess.run(
            [*TRIMTAB, "run", "--chunk-bytes", "512", "--resume", str(broken), "--", "true"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        said = proc.stdout + proc.stderr
        assert proc.returncode == 2, (how, said)
        assert says in said and "--resume DIR/ckpt-N" in said and "ckpt-00000004" in said, said
        assert "coordinator" not in said, said
        shutil.rmtree(broken)


def test_resuming_from_a_half_written_checkpoint_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    half = tmp_path / "ckpts" / "ckpt-00000008"
    half.mkdir(parents=True)
    (half / "server-0.chunks").write_bytes(b"TRIMTAB-CHUNKS-1\n")  # and no manifest
    started = time.monotonic()
    proc = subprocess.run(
        [*TRIMTAB, "run", "--resume", str(tmp_path / "ckpts"), "--", sys.executable, "-c", ""],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = proc.stdout + proc.stderr
    assert f"ckpt-00000008 has no {MANIFEST}" in said and "never completed" in said, said
    assert "coordinator" not in said and time.monotonic() - started < 60


FULL_DISK_SCRIPT = """
import time, torch, trimtab
trimtab.init()
model = torch.nn.Linear(256, 256)  # 257 KiB of float32: no server file fits the limit
opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01))
for step in range(trimtab.start_step(), 30):
    opt.zero_grad()
    model(torch.ones(2, 256)).sum().backward()
    opt.step()
    time.sleep(0.03)
trimtab.shutdown()
"""


def _file_size_limit() -> None:  # in the child: every file it (and its children) write
    import resource

    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(  # (0: trains to its end failing each time, 12 to 18 s: slow tier)
    "failures", [2, pytest.param(0, marks=pytest.mark.slow)]
)
def test_checkpoints_that_cannot_be_written_end_the_job_non_zero_leaving_nothing(
    tmp_path: Path, failures: int
) -> None:
    """A disk that takes no checkpoint (every file over 64 KiB refused, as a full disk
    refuses it: Python ignores SIGXFSZ, so the write fails): with --checkpoint-failures
    2 the job stops at the second failure in a row, with 0 it trains to its end; both
    end with status 1 naming the failure, and leave no checkpoint directory, partial or
    temporary file."""
    script = tmp_path / "train.py"
    script.write_text(FULL_DISK_SCRIPT)
    ckpts = tmp_path / "ckpts"
    flags = ["--checkpoint-every", "3", "--checkpoint-dir", str(ckpts)]
    flags += ["--checkpoint-failures", str(failures), "--deadline", "90"]
    proc = subprocess.run(
        [*TRIMTAB, "run", "-w", "2", "-s", "1", *flags, "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
        preexec_fn=_file_size_limit,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1, said[-3000:]
    assert "File too large" in said, said[-3000:]
    if failures:
        assert "2 checkpoints in a row failed" in said and "--checkpoint-failures 2" in said
    else:
        assert "the job ended, but the checkpoint at clock" in said, said[-3000:]
    left = sorted(str(p.relative_to(ckpts)) for p in ckpts.rglob("*")) if ckpts.exists() else []
    assert left == [], left
