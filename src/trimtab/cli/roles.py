"""``trimtab coordinator``, ``trimtab server`` and ``trimtab scale``: the roles of a job
started by hand (one per machine, or under Kubernetes or Slurm), with ps-lite's
``DMLC_*`` variables understood as well as ``TRIMTAB_*`` ones."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.faults.stragglers import parse_stragglers
from trimtab.faults.throttle import ThrottledTransport
from trimtab.launch import env as envvars
from trimtab.launch.control import ask_coordinator
from trimtab.launch.spec import LaunchConfig, add_flags, job_settings_from_args
from trimtab.protocol import headers
from trimtab.settings import (
    BatchingSettings,
    ConsistencySettings,
    ElasticSettings,
    PlacementSettings,
)
from trimtab.transport import Transport
from trimtab.transport.zmq import ZmqTransport, lane_from_env, spin_from_env

#: The job's server key, hex: the coordinator and the servers the launcher starts hold
#: it; a server's join ticket is made from it (:mod:`trimtab.runtime.credentials`).
SERVER_KEY = "TRIMTAB_SERVER_KEY"


def server_key(environ: Mapping[str, str]) -> bytes:
    """The server key from :data:`SERVER_KEY` (empty if unset). Raises
    :class:`ConfigError` if it is not hex."""
    text = environ.get(SERVER_KEY, "")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise ConfigError(
            f"{SERVER_KEY} must be hex digits (e.g. from `openssl rand -hex 32`)"
        ) from None


def ensure_server_key(environ: MutableMapping[str, str]) -> None:
    """Give a job started here a fresh server key, unless the user set one: the
    processes the launcher starts inherit it. Never raises."""
    if not environ.get(SERVER_KEY):
        environ[SERVER_KEY] = secrets.token_hex(32)


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
    coord.add_argument("--address-file", type=Path, help="write the bound address here")
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
        "--no-priority",
        action="store_true",
        default=not envvars.priority(environ),
        help="merge queued pushes in arrival order, not first layers first "
        "(for comparisons; or TRIMTAB_PRIORITY=0)",
    )
    server.add_argument("--verbose", "-v", action="store_true")
    server.set_defaults(handler=_server)

    scale = sub.add_parser("scale", help="ask a running job to go to K servers")
    scale.add_argument("--servers", type=int, required=True, help="the server count wanted")
    scale.add_argument(
        "--coordinator",
        default=coordinator,
        help="the job's coordinator, tcp://HOST:PORT (trimtab run prints it)",
    )
    scale.add_argument("--job", default=job)
    scale.set_defaults(handler=_scale)


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

    _logging(args.verbose)
    config = CoordinatorConfig.of(
        job_settings_from_args(args),
        job=args.job,
        host=args.host,
        port=args.port,
        server_key=server_key(os.environ),
    )
    transport = ZmqTransport(
        bind=True, host=config.host, port=config.port, lane=lane_from_env(os.environ)
    )
    coord = Coordinator(config, transport=transport)
    if args.address_file:
        tmp = args.address_file.with_suffix(".tmp")
        tmp.write_text(coord.address)
        tmp.rename(args.address_file)
    else:
        print(f"trimtab coordinator listening at {coord.address}", flush=True)
    coord.run()
    return 0


def _server(args: argparse.Namespace) -> int:
    import torch  # the server's own: the coordinator and the launcher do without

    from trimtab.roles.server import Server, ServerConfig

    _logging(args.verbose)
    if args.coordinator is None:
        raise ConfigError(
            "a server needs --coordinator tcp://HOST:PORT (or "
            "TRIMTAB_COORDINATOR, or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)"
        )
    torch.set_num_threads(1)  # chunk-sized element-wise work: threads only add overhead
    config = ServerConfig(
        coordinator=args.coordinator,
        job=args.job,
        host=args.host,
        port=args.port,
        priority=not args.no_priority,
        spin_s=spin_from_env(os.environ),
        server_key=server_key(os.environ),
    )
    transport: Transport = ZmqTransport(
        bind=True,
        host=config.host,
        port=config.port,
        max_frame_bytes=config.max_frame_bytes,
        lane=lane_from_env(os.environ),
    )
    specs = [s for s in parse_stragglers(args.straggler) if s.role == "server"]
    throttle = None
    if specs:  # a slow server is emulated around it: its link is paced
        throttle = ThrottledTransport(transport, specs, args.job, args.coordinator)
        transport = throttle
    server = Server(config, transport=transport)
    if throttle is not None:
        throttle.follow(server)
    server.run()
    return 0


def _scale(args: argparse.Namespace) -> int:
    if args.coordinator is None:
        raise ConfigError(
            "which job? give --coordinator tcp://HOST:PORT and --job ID (trimtab run "
            "prints both when started with --max-servers)"
        )
    reply = ask_coordinator(args.coordinator, args.job, headers.scale(servers=args.servers), 10.0)
    target = headers.read_scale_reply(reply)["target"]
    print(f"trimtab: the job goes to {target} servers", flush=True)
    return 0
