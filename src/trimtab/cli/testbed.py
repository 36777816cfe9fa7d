"""``trimtab testbed up|down|status``: the multi-host test bed (:mod:`trimtab.launch.testbed`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from trimtab.launch.cores import available_cores
from trimtab.launch.testbed import Testbed, list_beds, remove_stale


def add_commands(sub: Any) -> None:
    """Add ``testbed`` to the subcommands ``sub`` (argparse's subparsers)."""
    bed = sub.add_parser(
        "testbed",
        help="network namespaces as hosts on one machine (needs root)",
        description="Make, list or remove a test bed: HOSTS network namespaces on a bridge, "
        "addresses 10.77.X.I/24, links shaped by the kernel (tc tbf). A bed made by `up` "
        "stays until `down` removes it; `down` also removes beds left by killed runs.",
    )
    cmds = bed.add_subparsers(dest="testbed_cmd", required=True)
    up = cmds.add_parser("up", help="make a bed and print its hosts")
    up.add_argument("--hosts", type=int, default=4, help="hosts (4)")
    up.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="MBIT",
        help="shape every host's link to MBIT Mbit/s each way (tbf; default none)",
    )
    up.add_argument("--json", action="store_true", help="print the bed as JSON")
    up.set_defaults(handler=_up)
    down = cmds.add_parser("down", help="remove beds whose owner has gone (or --all)")
    down.add_argument("--all", action="store_true", help="also beds of live processes")
    down.set_defaults(handler=_down)
    rate = cmds.add_parser(
        "rate", help="the raw TCP rate between two hosts of a fresh bed (removed after)"
    )
    rate.add_argument(
        "--rate",
        type=float,
        default=0.0,
        metavar="MBIT",
        help="shape the receiver's link to MBIT Mbit/s first (tbf)",
    )
    rate.add_argument("--seconds", type=float, default=2.0, help="how long to send (2)")
    rate.add_argument("--json", action="store_true", help="print the result as JSON")
    rate.set_defaults(handler=_rate)
    status = cmds.add_parser("status", help="list the beds on this machine")
    status.add_argument("--json", action="store_true", help="print the beds as JSON")
    status.set_defaults(handler=_status)


def _up(args: argparse.Namespace) -> int:
    bed = Testbed(args.hosts, owner=os.getpid())
    bed.up()
    try:
        if args.rate > 0:
            for i in range(args.hosts):
                bed.shape(i, rate_mbit=args.rate)
    except BaseException:
        bed.down()
        raise
    # Left up on purpose: this process ends now, and `down` removes the bed.
    import atexit

    atexit.unregister(bed.down)
    hosts = [{"namespace": h.namespace, "address": h.address} for h in bed.hosts]
    if args.json:
        print(json.dumps({"id": bed.id, "subnet": str(bed.subnet), "hosts": hosts}))
    else:
        print(
            f"bed {bed.id}, {bed.subnet}; run a command in a host with "
            "`ip netns exec NAMESPACE COMMAND`; remove it with `trimtab testbed down`"
        )
        for h in hosts:
            print(f"  {h['namespace']}  {h['address']}")
    return 0


def _down(args: argparse.Namespace) -> int:
    removed = remove_stale(everything=args.all)
    print(f"removed {len(removed)} bed(s)" + (f": {removed}" if removed else ""))
    return 0


def _status(args: argparse.Namespace) -> int:
    beds = list_beds()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "id": b.id,
                        "owner": b.owner,
                        "alive": b.alive,
                        "subnet": b.subnet,
                        "hosts": [
                            {"namespace": h.namespace, "address": h.address} for h in b.hosts
                        ],
                    }
                    for b in beds
                ]
            )
        )
        return 0
    if not beds:
        print("no test bed on this machine")
    for b in beds:
        state = "owner running" if b.alive else "owner gone: `trimtab testbed down` removes it"
        print(f"bed {b.id}, {b.subnet or 'no address'}, {len(b.hosts)} hosts ({state})")
        for h in b.hosts:
            print(f"  {h.namespace}  {h.address}")
    return 0


def _rate(args: argparse.Namespace) -> int:
    with Testbed(2) as bed:
        if args.rate > 0:
            bed.shape(1, rate_mbit=args.rate)
        stream = bed.tcp_stream(0, 1, seconds=args.seconds)
    cores = available_cores()
    if args.json:
        print(
            json.dumps(
                {
                    "bytes_per_s": stream.bytes_per_s,
                    "shaped_mbit": args.rate,
                    "cores_busy": stream.cores_busy,
                    "cores": cores,
                }
            )
        )
    else:
        shaped = f" (tbf rate {args.rate:g}mbit)" if args.rate > 0 else " (unshaped)"
        busy = (
            ""
            if stream.cores_busy is None
            else f"; {stream.cores_busy:.2f} of this machine's {cores} cores busy"
        )
        rate = stream.bytes_per_s / 1e6
        print(f"one TCP stream between two hosts: {rate:.0f} MB/s{shaped}{busy}")
    return 0
