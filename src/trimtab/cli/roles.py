"""``trimtab coordinator``, ``trimtab server``, ``trimtab scale`` and ``trimtab
checkpoint``: the roles of a job started by hand (one per machine, or under Kubernetes
or Slurm), with ps-lite's ``DMLC_*`` variables understood as well as ``TRIMTAB_*``
ones, and the tools that ask a running job."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from trimtab.errors import ConfigError
from trimtab.faults.crash import wrap_coordinator, wrap_server
from trimtab.faults.kills import parse_faults
from trimtab.faults.stragglers import parse_stragglers
from trimtab.faults.throttle import ThrottledTransport
from trimtab.launch import env as envvars
from trimtab.launch import niceness
from trimtab.launch.control import ask_coordinator
from trimtab.launch.env import SERVER_KEY
from trimtab.launch.spec import LaunchConfig, add_flags, from_args, job_settings_from_args
from trimtab.observe.settings import ObserveSettings
from trimtab.protocol import elastic, headers
from trimtab.runtime.trace import trace_from
from trimtab.settings import (
    BatchingSettings,
    CheckpointSettings,
    ConsistencySettings,
    ElasticSettings,
    PlacementSettings,
)
from trimtab.transport import Transport
from trimtab.transport.auth import (
    AUTH_ENV,
    SECRET_FILE_ENV,
    JobKey,
    auth_from_env,
    make_secret_file,
)
from trimtab.transport.limits import Limits
from trimtab.transport.shm import turned_off as shm_turned_off
from trimtab.transport.zmq import ZmqTransport, lane_from_env, spin_from_env


def server_key(environ: Mapping[str, str], key: JobKey | None) -> bytes:
    """The job's server key: a server's join ticket is made from it
    (:mod:`trimtab.runtime.credentials`). :data:`SERVER_KEY` if set, else derived from
    the job's secret ``key``; empty without either (then no server joins a placed job).
    Raises :class:`ConfigError` if :data:`SERVER_KEY` is not hex."""
    text = environ.get(SERVER_KEY, "")
    if not text:
        return key.derive(b"server join") if key is not None else b""
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(
            f"{SERVER_KEY} must be hex digits (e.g. from `openssl rand -hex 32`)"
        ) from None


def _auth_flags(parser: argparse.ArgumentParser, made_here: bool = False) -> None:
    more = " (made, mode 0600, if it does not exist)" if made_here else ""
    parser.add_argument(
        "--secret-file",
        metavar="PATH",
        help=f"the job's secret file{more}; or {SECRET_FILE_ENV}",
    )
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="encrypt TCP traffic (ZeroMQ CURVE); every role of the job must say so",
    )


def add_commands(sub: Any, environ: Mapping[str, str]) -> None:
    """Add ``coordinator``, ``server`` and ``scale`` to the subcommands ``sub``; their
    defaults come from ``environ``. Raises :class:`ConfigError` for a malformed count."""
    coordinator = envvars.coordinator_address(environ)
    job = envvars.job_id(environ)

    coord = sub.add_parser("coordinator", help="start a job's coordinator (multi-machine)")
    coord.add_argument(
        "--workers",
        type=int,
        default=envvars.env_int(environ, envvars.NUM_WORKERS, envvars.DMLC_NUM_WORKER, default=1),
    )
    coord.add_argument(
        "--servers",
        type=int,
        default=envvars.env_int(environ, envvars.NUM_SERVERS, envvars.DMLC_NUM_SERVER, default=1),
    )
    coord.add_argument("--host", default=environ.get(envvars.DMLC_PS_ROOT_URI, "127.0.0.1"))
    coord.add_argument(
        "--port", type=int, default=envvars.env_int(environ, envvars.DMLC_PS_ROOT_PORT, default=0)
    )
    coord.add_argument("--job", default=job)
    add_flags(coord, PlacementSettings)
    add_flags(coord, ConsistencySettings)
    add_flags(coord, BatchingSettings)
    add_flags(coord, ElasticSettings)
    add_flags(coord, CheckpointSettings)
    add_flags(coord, ObserveSettings)
    coord.add_argument("--address-file", type=Path, help="write the bound address here")
    coord.add_argument(
        "--rejoin",
        action="store_true",
        help="replace the job's coordinator, which died: bind its address (--host, --port) "
        "and rebuild the job from its servers and workers, which rejoin",
    )
    coord.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="fault specs: each coordinator:N:kill@STEP given kills this coordinator as a "
        "worker reports STEP (trimtab run gives each coordinator those of its number)",
    )
    coord.add_argument(
        "--done-workers",
        type=_ranks,
        default=(),
        metavar="R,R,...",
        help="with --rejoin: the ranks of the workers whose processes ended already",
    )
    _auth_flags(coord, made_here=True)
    add_flags(coord, LaunchConfig, ("verbose",))
    coord.set_defaults(handler=_coordinator)

    server = sub.add_parser("server", help="start a server (multi-machine)")
    server.add_argument(
        "--coordinator",
        default=coordinator,
        help="tcp://HOST:PORT (or TRIMTAB_COORDINATOR / DMLC_PS_ROOT_*)",
    )
    server.add_argument("--job", default=job)
    server.add_argument("--host", default=environ.get(envvars.DMLC_NODE_HOST, "127.0.0.1"))
    server.add_argument("--port", type=int, default=0)
    server.add_argument(
        "--straggler",
        action="append",
        default=[environ.get(envvars.STRAGGLERS, "")],
        metavar="SPEC",
        help="server straggler specs (those naming this server's index apply)",
    )
    server.add_argument(
        "--fault",
        action="append",
        default=[environ.get(envvars.FAULTS, "")],
        metavar="SPEC",
        help="fault specs, e.g. server:1:kill@30 (those killing this server's index apply)",
    )
    server.add_argument(
        "--no-priority",
        action="store_true",
        default=not envvars.priority(environ),
        help="merge queued pushes in arrival order, not first layers first "
        "(for comparisons; or TRIMTAB_PRIORITY=0)",
    )
    server.add_argument("--verbose", "-v", action="store_true")
    _auth_flags(server)
    server.set_defaults(handler=_server)

    scale = sub.add_parser("scale", help="ask a running job to go to K servers or workers")
    scale.add_argument("--servers", type=int, help="the server count wanted")
    scale.add_argument(
        "--workers",
        type=int,
        help="the worker count wanted (a job started with --max-workers; trimtab run "
        "starts the new ones, which join at a step boundary)",
    )
    scale.add_argument(
        "--coordinator",
        default=coordinator,
        help="the job's coordinator, tcp://HOST:PORT (trimtab run prints it)",
    )
    scale.add_argument("--job", default=job)
    _auth_flags(scale)
    scale.set_defaults(handler=_scale)

    ckpt = sub.add_parser("checkpoint", help="ask a running job to write a checkpoint now")
    ckpt.add_argument(
        "--coordinator",
        default=coordinator,
        help="the job's coordinator, tcp://HOST:PORT (trimtab run -v prints it)",
    )
    ckpt.add_argument("--job", default=job)
    ckpt.add_argument(
        "--timeout", type=float, default=120.0, metavar="S", help="wait this long for it (120)"
    )
    _auth_flags(ckpt)
    ckpt.set_defaults(handler=_checkpoint)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(name)s: %(message)s",
        stream=sys.stderr,
    )


def _coordinator(args: argparse.Namespace) -> int:
    # Each role is imported when its command runs: the others, and `trimtab --help`,
    # need not load it (a server's role loads torch).
    from trimtab.roles.coordinator import Coordinator, CoordinatorConfig
    from trimtab.roles.coordinator.checkpoint import CHECKPOINT_FAILED_STATUS

    _logging(args.verbose)
    key = _coordinator_key(args)
    config = CoordinatorConfig.of(
        job_settings_from_args(args),
        job=args.job,
        host=args.host,
        port=args.port,
        server_key=server_key(os.environ, key),
        checkpoint=from_args(CheckpointSettings, args),
    )
    if args.done_workers and not args.rejoin:
        raise ConfigError("--done-workers is for a coordinator started with --rejoin")
    if args.rejoin and not args.port:
        raise ConfigError(
            "--rejoin needs the dead coordinator's --port: its members reconnect there"
        )
    config = dataclasses.replace(config, rejoin=args.rejoin, done_workers=args.done_workers)
    # How fast a silent node is declared lost (tests shorten it).
    heartbeat_s = float(os.environ.get("TRIMTAB_HEARTBEAT_S", config.heartbeat_s))
    dead_after_s = envvars.dead_after_s(os.environ, config.dead_after_s)
    config = dataclasses.replace(config, heartbeat_s=heartbeat_s, dead_after_s=dead_after_s)
    transport = ZmqTransport(
        bind=True,
        host=config.host,
        port=config.port,
        lane=lane_from_env(os.environ),
        auth=key,
        limits=Limits.for_job(config.chunk_bytes),
    )
    # --fault: this coordinator killed at a step (itself, untouched: see faults.crash)
    wrapped = wrap_coordinator(transport, parse_faults(args.fault), config.job)
    coord = Coordinator(config, transport=wrapped)
    live = _live(coord, config, from_args(ObserveSettings, args))
    if args.address_file:
        tmp = args.address_file.with_suffix(".tmp")
        tmp.write_text(coord.address)
        tmp.rename(args.address_file)
    else:
        print(f"trimtab coordinator listening at {coord.address}", flush=True)
    try:
        coord.run()
    finally:
        live.close()
    failing = coord.checkpoints.failing
    if failing is not None:  # it trained to its end, but has no checkpoint of late
        print(f"trimtab coordinator: the job ended, but {failing}", flush=True)
        return CHECKPOINT_FAILED_STATUS
    return 0


def _live(coord: Any, config: Any, settings: ObserveSettings) -> Any:
    """The live view of ``coord``'s job (:mod:`trimtab.observe`), where it says so."""
    from trimtab.observe.live import Live

    resolved = {k: v for k, v in dataclasses.asdict(config).items() if k != "server_key"}
    live = Live(coord.events, settings, config.job, resolved)
    for line in live.lines:
        print(f"trimtab coordinator: {line}", flush=True)
    return live


def _ranks(text: str) -> tuple[int, ...]:
    """``--done-workers``: ranks joined by commas. Raises ``ValueError`` otherwise."""
    ranks = tuple(int(r) for r in text.split(",") if r.strip())
    if any(r < 0 for r in ranks):
        raise ValueError(text)
    return ranks


def _coordinator_key(args: argparse.Namespace) -> JobKey | None:
    """The job's key: from ``--secret-file``/``TRIMTAB_SECRET_FILE`` (made there if the
    file does not exist), else from a new file in a private directory, removed when the
    coordinator exits. Raises :class:`ConfigError` as :func:`auth_from_env`."""
    if os.environ.get(AUTH_ENV, "1") == "0":
        print("trimtab coordinator: WARNING: TRIMTAB_AUTH=0, no authentication", flush=True)
        return None
    path = args.secret_file or os.environ.get(SECRET_FILE_ENV)
    if path is None:
        private = Path(tempfile.mkdtemp(prefix="trimtab-secret-"))  # mode 0700
        atexit.register(shutil.rmtree, private, True)
        path = str(make_secret_file(private))
        print(
            f"trimtab coordinator: the job's secret is in {path}; give every other role "
            f"--secret-file {path} (or {SECRET_FILE_ENV}), on another host a copy of mode 0600",
            flush=True,
        )
    elif not Path(path).exists():
        try:
            make_secret_file(Path(path).parent, Path(path).name)
        except OSError as exc:
            raise ConfigError(f"cannot make the job's secret file {path}: {exc}") from None
    return auth_from_env(os.environ, path, encrypt=args.encrypt)


def _server(args: argparse.Namespace) -> int:
    import torch  # the server's own: the coordinator and the launcher do without

    from trimtab.roles.server import Server, ServerConfig
    from trimtab.roles.server.optim import never_compiled

    _logging(args.verbose)
    if args.coordinator is None:
        raise ConfigError(
            "a server needs --coordinator tcp://HOST:PORT (or "
            "TRIMTAB_COORDINATOR, or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)"
        )
    torch.set_num_threads(1)  # chunk-sized element-wise work: threads only add overhead
    never_compiled()  # (torch.optim's compile guards import torch._dynamo otherwise)
    key = auth_from_env(os.environ, args.secret_file, encrypt=args.encrypt)
    serving = niceness.serving_nice(os.environ)
    config = ServerConfig(
        coordinator=args.coordinator,
        job=args.job,
        shared_memory=not shm_turned_off(os.environ),
        host=args.host,
        port=args.port,
        priority=not args.no_priority,
        spin_s=spin_from_env(os.environ),
        server_key=server_key(os.environ, key),
        coordinator_timeout_s=float(
            os.environ.get(envvars.COORDINATOR_TIMEOUT_S, ServerConfig.coordinator_timeout_s)
        ),
    )
    transport: Transport = ZmqTransport(
        bind=True,
        host=config.host,
        port=config.port,
        max_frame_bytes=config.max_frame_bytes,
        lane=lane_from_env(os.environ),
        auth=key,
    )
    specs = [s for s in parse_stragglers(args.straggler) if s.role == "server"]
    throttle = None
    if specs:  # a slow server is emulated around it: its link is paced
        throttle = ThrottledTransport(transport, specs, args.job, args.coordinator)
        transport = throttle
    transport, crash = wrap_server(transport, parse_faults(args.fault), args.job)
    server = Server(config, transport=transport)
    # SIGTERM (a launcher stopping the job, or one that ended before this server could
    # join it) ends the loop by an exception: its cleanup still runs, and checkpoint
    # files being written are finished first.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if throttle is not None:
        throttle.follow(server)
    if crash is not None:  # --fault: this server killed at a step
        crash.follow(server)
    server.trace = trace_from(os.environ, "server")  # TRIMTAB_TRACE (--trace)
    if serving is not None:  # started at the lowest priority (a test bed's late server)
        server.on_serving = lambda: _take_priority(server, serving)
    try:
        server.run()
    finally:
        if server.trace is not None:  # named once its index is known
            server.trace.name = f"server-{server.index}" if server.index >= 0 else "server"
            server.trace.save()
    _exit_at_once(0)


def _take_priority(server: Any, nice: int) -> None:
    """Once ``server`` serves: its threads back to nice ``nice`` and its session's group
    to 0 (:func:`trimtab.launch.niceness.restore`), said in its output either way. On
    the server's loop thread; never raises (a refusal leaves it wholly at the lowest
    priority, and says so)."""
    try:
        threads = niceness.restore(nice)
    except OSError as exc:
        print(
            f"server {server.index} stays at nice {niceness.START_NICE} (the lowest "
            f"priority it started at): {exc}",
            file=sys.stderr,
            flush=True,
        )
        return
    print(f"server {server.index} serving: priority back to nice {nice} ({threads} threads)",
          flush=True)  # fmt: skip


def _exit_at_once(code: int) -> NoReturn:
    """End a server's process without the interpreter's finalization. Its loop has
    closed everything of its own (sockets, their ZeroMQ context after its linger,
    arenas, checkpoint writers), and tearing down torch's modules cost 0.5 to 1 s of
    CPU that every job's end waited for. Flushes logging and the standard streams."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _tool_key(args: argparse.Namespace) -> JobKey | None:
    """The job key a tool command (scale, checkpoint) proves itself with. Raises
    :class:`ConfigError` if it was not told which job (or as :func:`auth_from_env`)."""
    if args.coordinator is None:
        raise ConfigError(
            "which job? give --coordinator tcp://HOST:PORT and --job ID (or "
            "TRIMTAB_COORDINATOR and TRIMTAB_JOB; trimtab run prints both)"
        )
    return auth_from_env(os.environ, args.secret_file, encrypt=args.encrypt)


def _scale(args: argparse.Namespace) -> int:
    if args.servers is None and args.workers is None:
        raise ConfigError("scale to what? give --servers K, --workers K, or both")
    key = _tool_key(args)
    if args.servers is not None:
        reply = ask_coordinator(
            args.coordinator, args.job, headers.scale(servers=args.servers), 10.0, key
        )
        target = headers.read_scale_reply(reply)["target"]
        print(f"trimtab: the job goes to {target} servers", flush=True)
    if args.workers is not None:
        reply = ask_coordinator(
            args.coordinator, args.job, elastic.scale_workers(workers=args.workers), 10.0, key
        )
        target = elastic.read_scale_workers_reply(reply)["target"]
        print(f"trimtab: the job goes to {target} workers", flush=True)
    return 0


def _checkpoint(args: argparse.Namespace) -> int:
    key = _tool_key(args)
    reply = ask_coordinator(args.coordinator, args.job, headers.checkpoint(), args.timeout, key)
    done = headers.read_checkpoint_reply(reply)
    print(f"trimtab: checkpoint at step {done['k']} written to {done['path']}", flush=True)
    return 0
