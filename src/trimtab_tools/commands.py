"""``trimtab bench``, ``trimtab experiment`` and ``trimtab simulate``: the tools'
subcommands.

Registered with the ``trimtab`` command through the ``trimtab.commands`` entry point
(see ``pyproject.toml`` and :mod:`trimtab.cli.plugins`); the runtime never imports this
package. Adding the subcommands loads the drivers' flag definitions only: the drivers
and their worker scripts load torch when they run, not here.
"""

from __future__ import annotations

import argparse
from typing import Any

from trimtab_tools.bench import collectives, datapath, msgcost, overlap, policies
from trimtab_tools.experiments import faults, psld, psld_pause, soak, sparse, stragglers
from trimtab_tools.sim import command as simulate
from trimtab_tools.sim import validate


def add_commands(sub: Any) -> None:
    """Add ``experiment``, ``bench`` and ``simulate`` to ``trimtab``'s subcommands ``sub``."""
    exp = sub.add_parser("experiment", help="experiments (whole jobs side by side)")
    exp_sub = exp.add_subparsers(dest="experiment", required=True)
    stragglers.add_arguments(
        exp_sub.add_parser("stragglers", help="worker stragglers: bsp, lbbsp, asp, ssp, saps, ddp")
    )
    psld_parser = exp_sub.add_parser(
        "psld", help="server stragglers: hash, mxnet, greedy, psld placements side by side"
    )
    psld.add_arguments(psld_parser)
    psld_pause.add_arguments(psld_parser)
    faults.add_arguments(
        exp_sub.add_parser(
            "faults", help="server and worker kills, a join: lost updates, equivalence"
        )
    )
    soak.add_arguments(
        exp_sub.add_parser("soak", help="random kills, joins and migrations for M minutes")
    )
    sparse.add_arguments(
        exp_sub.add_parser(
            "sparse", help="embedding tables: hot keys, a classic row PS and DDP side by side"
        )
    )
    validate.add_arguments(
        exp_sub.add_parser(
            "validate-sim",
            help="real jobs on the test bed against the simulator calibrated on them",
        )
    )
    exp.set_defaults(handler=_experiment)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    datapath.add_arguments(bench_sub.add_parser("datapath", help="push+pull step vs limits, peers"))
    overlap.add_arguments(
        bench_sub.add_parser("overlap", help="next forward overlapping the step (model=, priority)")
    )
    collectives.add_arguments(
        bench_sub.add_parser("collectives", help="one scalar allreduce through the coordinator")
    )
    msgcost.add_arguments(
        bench_sub.add_parser("msgcost", help="CPU per chunk of worker and server, vs the lean PS")
    )
    policies.add_arguments(
        bench_sub.add_parser("policies", help="each policy decision alone at a cluster's size")
    )
    bench.set_defaults(handler=_bench)
    simulate.add_arguments(
        sub.add_parser(
            "simulate",
            help="simulate a job of any size with the real policies (no processes)",
            description=simulate.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )


def _experiment(args: argparse.Namespace) -> int:
    drivers = {
        "psld": psld_pause.main,
        "faults": faults.main,
        "soak": soak.main,
        "validate-sim": validate.main,
        "sparse": sparse.main,
    }
    return drivers.get(args.experiment, stragglers.main)(args)


def _bench(args: argparse.Namespace) -> int:
    drivers = {
        "overlap": overlap.main,
        "collectives": collectives.main,
        "msgcost": msgcost.main,
        "policies": policies.main,
    }
    return drivers.get(args.bench, datapath.main)(args)
