"""Subcommands from other distributions: the ``trimtab.commands`` entry points.

An entry point of the group names a function ``add_commands(subparsers) -> None`` that
adds its subcommands to ``trimtab``'s parser, each with ``set_defaults(handler=fn)``
where ``fn(args) -> int`` carries it out. It should add them cheaply (no torch, no
heavy imports until ``fn`` runs): it runs for every ``trimtab`` command, ``--help``
too. ``trimtab_tools`` (``trimtab bench``, ``trimtab experiment``) plugs in this way,
so the runtime never imports it.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

#: The entry-point group that extends the ``trimtab`` command.
GROUP = "trimtab.commands"

log = logging.getLogger("trimtab.cli")


def add_commands(sub: Any) -> None:
    """Let every installed ``trimtab.commands`` entry point add its subcommands to
    ``sub``, in the order of the entry points' names. One that fails to load is
    reported on stderr and left out; the others and the built-in commands still work.
    """
    for point in sorted(entry_points(group=GROUP), key=lambda p: p.name):
        try:
            point.load()(sub)
        except Exception as exc:  # a broken tool must not take `trimtab run` down with it
            log.warning("trimtab: the commands of %s could not be loaded: %s", point.value, exc)
