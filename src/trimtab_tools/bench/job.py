"""Running a benchmark job: what ``trimtab bench datapath``, ``overlap`` and the
profiler share (a job whose rank 0 prints its step times), and a busy neighbour."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trimtab.launch import env as envvars
from trimtab.launch.job import Job, LaunchConfig
from trimtab.launch.testbed import Testbed
from trimtab.observe.settings import ObserveSettings
from trimtab_tools.bench.markers import RESULT

__all__ = ["busy_process", "interleaved", "job_shape", "run_timed_job", "run_trimtab"]


def run_trimtab(
    sizes: list[int],
    steps: int,
    chunk_bytes: int,
    workers: int = 2,
    servers: int = 2,
    *,
    warmup: int = 3,
    go_file: Path | None = None,
    on_line: Callable[[str, str], None] | None = None,
    compression: str = "none",
    shm: bool = True,
    lane: bool = True,
    spin: bool = True,
    info: dict[str, Any] | None = None,
    auth: str = "on",
    replicas: int = 0,
    testbed: Testbed | None = None,
    read_grads: bool = False,
    observe: ObserveSettings | None = None,
) -> list[float]:
    """Per-step seconds of trimtab on rank 0, after ``warmup`` untimed steps.

    ``go_file`` and ``on_line`` are the profiler's handshake (see
    ``_datapath_worker.py``): every line the job prints is handed to ``on_line`` first.
    ``shm=False`` sends every byte through TCP (``TRIMTAB_SHM=0``), ``lane=False`` the
    messages through ZeroMQ rather than the local lane (``TRIMTAB_LANE=0``), ``spin=False``
    makes every wait sleep at once (``TRIMTAB_SPIN_US=0``; otherwise ``trimtab run``
    decides, or the caller's environment); ``info`` receives the job's other figures
    (``shared_pushes``, ``spin_us``). ``auth``: ``on`` (the job's secret, the default),
    ``off`` (``--no-auth``, insecure, to measure its cost) or ``encrypt`` (``--encrypt``).
    ``replicas``: each chunk's backups (``--replicas``).
    ``testbed``: each role on a host of this bed (``trimtab run --testbed``), over TCP.
    ``read_grads``: the script reads every ``.grad`` after each step (timed with it).
    ``observe``: the dashboard and run record (default none: the figures stay those of
    the data path alone; ``bench datapath --observe compare`` measures what they cost).
    Blocks for the job; raises RuntimeError on failure.
    """
    command = [
        sys.executable,
        "-m",
        "trimtab_tools.bench._datapath_worker",
        "--sizes",
        ",".join(map(str, sizes)),
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
    ]
    if go_file is not None:
        command += ["--go-file", str(go_file)]
    if read_grads:
        command.append("--read-grads")
    config = LaunchConfig(
        workers=workers,
        servers=servers,
        chunk_bytes=chunk_bytes,
        placement="greedy",
        compression=compression,
        no_auth=auth == "off",
        encrypt=auth == "encrypt",
        replicas=replicas,
        observe=observe or ObserveSettings(no_dashboard=True, runs_dir=""),
    )
    env = {}
    if not shm:
        env[envvars.SHM] = "0"
    if not lane:
        env[envvars.LANE] = "0"
    if not spin:
        env[envvars.SPIN_US] = "0"
    return run_timed_job(
        config, command, on_line=on_line, env=env or None, info=info, testbed=testbed
    )


def interleaved(
    variants: dict[Any, dict[str, Any]],
    sizes: list[int],
    steps: int,
    chunk_bytes: int,
    rounds: int,
) -> dict[Any, list[float]]:
    """Run the 2 x 2 trimtab job once per variant (``run_trimtab``'s keyword arguments
    of each) per round, the variants interleaved round by round so that a machine's
    drift touches all alike; each variant's median step of each round. Blocks; raises
    RuntimeError if a job fails."""
    runs: dict[Any, list[float]] = {key: [] for key in variants}
    for _ in range(rounds):
        for key, kwargs in variants.items():
            runs[key].append(statistics.median(run_trimtab(sizes, steps, chunk_bytes, **kwargs)))
    return runs


def job_shape(sizes: list[int], steps: int, chunk_bytes: int, rounds: int) -> dict[str, Any]:
    """The fields that say which 2 x 2 job a comparison ran, for its JSON result."""
    return {
        "model_bytes": sum(sizes),
        "workers": 2,
        "servers": 2,
        "chunk_bytes": chunk_bytes,
        "steps": steps,
        "rounds": rounds,
    }


@contextlib.contextmanager
def busy_process() -> Iterator[subprocess.Popen[bytes]]:
    """Keep one other process busy (a pure Python loop) while the block runs: a user of
    the machine the job does not know of. Blocks only to stop it (killed, then reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def run_timed_job(
    config: LaunchConfig,
    command: list[str],
    *,
    on_line: Callable[[str, str], None] | None = None,
    env: dict[str, str] | None = None,
    info: dict[str, Any] | None = None,
    testbed: Testbed | None = None,
) -> list[float]:
    """Run a benchmark job whose rank 0 prints its step times after :data:`RESULT`;
    return them (and the result's other fields into ``info``). Every line the job
    prints is handed to ``on_line`` first; ``testbed``: the roles on its hosts. Blocks;
    raises RuntimeError if the job fails or prints no times."""
    found: list[float] = []
    log: list[str] = []

    def output(source: str, line: str) -> None:
        if on_line is not None:
            on_line(source, line)
        if line.startswith(RESULT):
            result = json.loads(line[len(RESULT) :])
            found.extend(result.pop("times"))
            if info is not None:
                info.update(result)
        else:
            log.append(f"[{source}] {line}")

    status = Job(config, command, output=output, extra_env=env, testbed=testbed).run()
    if status != 0 or not found:
        raise RuntimeError(
            f"trimtab benchmark job failed (status {status}):\n" + "\n".join(log[-30:])
        )
    return found
