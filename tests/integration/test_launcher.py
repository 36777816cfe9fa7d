"""``trimtab run`` and ``trimtab train``: exit status, teardown, and no process left
behind, whether the job succeeds, a worker or a server crashes, or the user hits Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import processes_of
from trimtab.launch.job import Job, LaunchConfig

TRAIN_SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, trimtab
    trimtab.init()
    model = torch.nn.Linear(4, 2)
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters())
    mode = sys.argv[1]
    for step in range(10_000 if mode in ("hang", "server-dies") else 3):
        if mode == "crash" and trimtab.rank() == 1 and step == 2:
            raise SystemExit(3)
        if mode == "hang" and step == 2:
            print("READY", flush=True)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
    print(f"rank {trimtab.rank()} of {trimtab.size()} done", flush=True)
""")


def run_job(tmp_path: Path, mode: str, **kw: object) -> tuple[int, list[str], LaunchConfig]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    lines: list[str] = []
    config = LaunchConfig(workers=2, servers=2, **kw)  # type: ignore[arg-type]
    job = Job(
        config,
        [sys.executable, str(script), mode],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
    )
    status = job.run()
    return status, lines, config


@pytest.mark.timeout(60)
def test_successful_job_exits_zero_with_prefixed_output(tmp_path: Path) -> None:
    status, lines, config = run_job(tmp_path, "ok")
    assert status == 0, lines
    assert "[worker 0] rank 0 of 2 done" in lines
    assert "[worker 1] rank 1 of 2 done" in lines
    assert processes_of(config.job) == []


@pytest.mark.timeout(60)
def test_crashed_worker_ends_the_job_with_its_status(tmp_path: Path) -> None:
    status, lines, config = run_job(tmp_path, "crash")
    assert status == 3
    assert any("worker 1 exited with status 3; stopping the job" in line for line in lines)
    assert processes_of(config.job) == []


@pytest.mark.timeout(60)
def test_crashed_server_ends_the_job(tmp_path: Path) -> None:
    import threading

    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    lines: list[str] = []
    config = LaunchConfig(workers=2, servers=2)
    job = Job(
        config,
        [sys.executable, str(script), "server-dies"],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
    )

    def kill_a_server() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            servers = [p for p in job._procs if p.source == "server 1"]
            if servers and len(job._procs) == 5:
                time.sleep(3)  # let training start
                servers[0].handle.signal(signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_server)
    killer.start()
    status = job.run()
    killer.join()
    assert status == 1
    assert any(
        "server 1 exited with status -9 (killed by SIGKILL) while workers were running" in line
        for line in lines
    ), lines[-5:]
    assert processes_of(config.job) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    ("sig", "status", "said"),
    [  # (SIGTERM in the slow tier: the same teardown as Ctrl-C's)
        (signal.SIGINT, 130, "interrupted"),
        pytest.param(signal.SIGTERM, 143, "terminated", marks=pytest.mark.slow),
    ],
)
def test_ctrl_c_or_sigterm_stops_everything(
    tmp_path: Path, sig: signal.Signals, status: int, said: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trimtab",
            "run",
            "-w",
            "2",
            "-s",
            "1",
            "--",
            sys.executable,
            str(script),
            "hang",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # As from a terminal: a suite started in the background by a shell without job
        # control ignores SIGINT, and a child inherits that (the launcher then rightly
        # ignores Ctrl-C: seen when this suite ran as `bash -c '...' &`).
        preexec_fn=_default_sigint,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "READY" in line:
            break
    children = subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert len(children) == 4  # coordinator, server, 2 workers
    before = _signal_state(proc.pid)
    proc.send_signal(sig)
    try:
        rest = proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        # Say where the launcher was (its signal masks: an ignored SIGINT shows there).
        state = _signal_state(proc.pid)
        proc.kill()
        raise AssertionError(
            f"the launcher did not stop within 30 s of {sig.name}; before it: {before}; "
            f"after: {state}"
        ) from None
    assert proc.returncode == status  # 128 + the signal, as a shell reports it
    assert f"{said}; stopping every process of the job" in rest
    time.sleep(0.5)
    alive = [
        pid
        for pid in children
        if Path(f"/proc/{pid}").exists()
        and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    ]
    assert alive == []


def test_run_without_a_command_says_what_to_do() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trimtab", "run", "-w", "1", "-s", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "trimtab run -w 2 -s 2 -- python train.py" in proc.stderr


def test_run_with_a_bad_spin_says_what_to_give_and_starts_nothing() -> None:
    env = {**os.environ, "TRIMTAB_SPIN_US": "fast"}
    proc = subprocess.run(
        [sys.executable, "-m", "trimtab", "run", "-w", "1", "-s", "1", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 2
    assert "TRIMTAB_SPIN_US='fast'" in proc.stdout + proc.stderr
    assert "[coordinator]" not in proc.stdout


def test_script_without_a_job_says_how_to_start_one(tmp_path: Path) -> None:
    script = tmp_path / "alone.py"
    script.write_text("import trimtab\ntrimtab.init()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIMTAB_", "DMLC_"))}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode != 0
    assert "trimtab run --workers N" in proc.stderr


@pytest.mark.timeout(120)
def test_train_reaches_accuracy_and_prints_json_last() -> None:
    # A mark in the environment every process of this job inherits, so the leftover
    # check below sees only this job's processes, not another job's running beside it.
    mark = f"train-{os.getpid()}-{time.monotonic_ns()}"
    proc = subprocess.run(
        [sys.executable, "-m", "trimtab", "train", "--json"],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "TRIMTAB_TEST_MARK": mark},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["test_accuracy"] >= 0.95
    assert result["workers"] == 2 and result["servers"] == 2
    assert result["iterations"] > 0 and result["samples_per_s"] > 0
    assert _processes_marked(mark) == []


def _processes_marked(mark: str) -> list[int]:
    """The live processes whose environment holds ``TRIMTAB_TEST_MARK=mark``."""
    needle = f"TRIMTAB_TEST_MARK={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


@pytest.mark.slow  # (it waits out a 12 s deadline: the slow tier, which .ci/run runs too)
@pytest.mark.timeout(90)
def test_job_past_its_deadline_prints_every_stack_and_stops(tmp_path: Path) -> None:
    """`--deadline`: a hung job ends with status 124, and every process of it (workers,
    coordinator, server) printed where each of its threads was, then its protocol state
    (map, clocks, requests in flight), for the hang's report."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    command = [sys.executable, str(script), "hang"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trimtab",
            "run",
            "-w",
            "2",
            "-s",
            "1",
            "--deadline",
            "12",
            "--",
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=80,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out[-3000:]
    assert "ran past its deadline (12 s)" in out
    for source in ("worker 0", "worker 1", "coordinator", "server 0"):
        stacks = [line for line in out.splitlines() if line.startswith(f"[{source}]")]
        assert any("most recent call first" in line for line in stacks), (source, out[-3000:])
    worker = [line for line in out.splitlines() if line.startswith("[worker 0]")]
    assert any("train.py" in line for line in worker)  # the user's own frames
    states = {
        "worker 0": "worker 0: map epoch 1;",
        "worker 1": "worker 1: map epoch 1;",
        "coordinator": "coordinator: map epoch 1,",
        "server 0": "server 0 (serving): map epoch 1,",
    }
    for source, state in states.items():
        assert f"[{source}] {state}" in out, (source, out[-3000:])
    assert "  optimizer: clock " in out
    assert processes_of(str(script)) == []


BIG_SCRIPT = textwrap.dedent("""
    import time, torch, trimtab
    trimtab.init()
    model = torch.nn.Linear(256, 64)  # 64 KiB of weights: pushed through shared memory
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters())
    for step in range(100_000):
        if step == 2:
            print("READY", flush=True)
        model(torch.ones(2, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
        time.sleep(0.01)
""")


@pytest.mark.timeout(120)
def test_a_launcher_killed_outright_leaves_no_arena(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(BIG_SCRIPT)
    argv = [sys.executable, "-m", "trimtab", "run", "-w", "2", "-s", "1", "--"]
    proc = subprocess.Popen(
        [*argv, sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    ready = 0
    for line in proc.stdout:
        ready += "READY" in line
        if ready == 2:
            break
    children = subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    jobs = {
        item.split("=", 1)[1]
        for pid in children
        for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        if item.startswith("TRIMTAB_JOB=")
    }
    assert len(jobs) == 1
    job = jobs.pop()
    arenas = lambda: sorted(p.name for p in Path("/dev/shm").glob(f"trimtab-{job}-*"))  # noqa: E731
    assert len(arenas()) == 2, arenas()  # one per worker
    proc.kill()  # no chance to clean up: its children get SIGTERM from the kernel
    proc.wait()
    deadline = time.monotonic() + 30
    while processes_of(job) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of(job) == []
    assert arenas() == []


def _signal_state(pid: int) -> str:
    """A process's signal masks and each thread's state and kernel wait channel, from
    /proc (for a failure message)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        masks = [line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt"))]
        threads = []
        for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
            state = next(
                (x for x in (task / "status").read_text().splitlines() if x.startswith("State")),
                "",
            )
            threads.append(
                f"{task.name}:{state.split(':')[-1].strip()}:{(task / 'wchan').read_text()}"
            )
        return f"{masks}; threads {threads}"
    except OSError as exc:
        return f"unreadable ({exc})"


def _default_sigint() -> None:  # pragma: no cover - runs in the child before exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)


SCALE_AT_END = textwrap.dedent("""
    import glob, time, torch, trimtab, trimtab.frontend.api
    from trimtab.protocol.messages import Control
    trimtab.init()
    model = torch.nn.Linear(4, 2)
    opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       model.named_parameters())
    for step in range(3):
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    def servers_started():  # this job's `trimtab server` processes, as ps shows them
        job, n = trimtab.frontend.api.default_context().config.job, 0
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                argv = open(cmdline, "rb").read().split(b"\\0")
            except OSError:
                continue
            n += b"server" in argv and job.encode() in argv
        return n
    if trimtab.rank() == 0:  # a third server, asked for as the job ends
        trimtab.frontend.api.default_context().call({"o": int(Control.SCALE), "servers": 3})
        while servers_started() < 3:  # started, still importing torch: the job ends now
            time.sleep(0.02)
        print("ASKED", flush=True)
    trimtab.shutdown()
""")


@pytest.mark.timeout(90)
def test_a_server_started_to_join_as_the_job_ends_does_not_hold_it(tmp_path: Path) -> None:
    """The servers' case of ``test_a_worker_started_to_join_as_the_job_ends_does_not_hang_it``:
    a server the launcher starts for a SCALE asked at the last step comes up after the
    job ended, and would wait out the coordinator's timeout for a reply to its REGISTER.
    The launcher stops it once the coordinator has exited normally, instead of waiting
    out its grace (a minute here: a job held that long runs past its deadline)."""
    from trimtab.cli.roles import SERVER_KEY

    script = tmp_path / "train.py"
    script.write_text(SCALE_AT_END)
    lines: list[str] = []
    config = LaunchConfig(workers=2, servers=2, max_servers=3, grace_s=60.0, deadline_s=45.0)
    job = Job(
        config,
        [sys.executable, str(script)],
        output=lambda src, line: lines.append(f"[{src}] {line}"),
        extra_env={SERVER_KEY: "cd" * 32},
    )
    assert job.run() == 0, "\n".join(lines[-60:])
    assert "[worker 0] ASKED" in lines
    assert any("starting server 2" in line for line in lines), lines
    stopped = "[trimtab] server 2 is still running after the job ended: stopping it"
    assert stopped in lines, lines
    assert processes_of(config.job) == []
