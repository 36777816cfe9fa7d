"""The ``trimtab`` command: run jobs, start roles by hand, train the example.

The tools' subcommands (``trimtab bench``, ``trimtab experiment``) are not part of the
runtime: the ``trimtab_tools`` distribution registers them through the
``trimtab.commands`` entry-point group, which :mod:`trimtab.cli.plugins` loads.

The CLI is an edge: it reads flags and environment variables (every name in
:mod:`trimtab.launch.env`) and passes settings down as arguments. Below it, only the
launcher (for the processes it starts) and a worker's ``trimtab.init()`` read the
environment; the roles and the transport never do.
"""

from trimtab.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
