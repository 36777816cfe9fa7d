"""trimtab from a Ray driver: ``trimtab.ray.run(["python", "train.py"], workers=4,
servers=2)`` runs a whole job on the Ray cluster this driver is connected to (or the
one ``address`` names), as ``trimtab run --backend ray`` does
(:mod:`trimtab.launch.backends.ray`): every role a Ray Core actor running trimtab's own
process; tensors travel over trimtab's transport, never Ray's object store.

Needs Ray (``pip install 'trimtab[ray]'``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trimtab.launch.job import Job, OutputHandler, print_prefixed
from trimtab.launch.spec import LaunchConfig

__all__ = ["run"]


def run(
    command: Sequence[str],
    workers: int = 2,
    servers: int = 1,
    address: str = "",
    output: OutputHandler = print_prefixed,
    env: dict[str, str] | None = None,
    **settings: Any,
) -> int:
    """Run ``command`` in ``workers`` worker actors beside ``servers`` server actors and a
    coordinator on this node, on the Ray cluster at ``address`` (default: the one
    ``ray.init`` connected this process to, ``RAY_ADDRESS``, or a new one of this
    machine's); ``settings`` are :class:`~trimtab.launch.spec.LaunchConfig`'s fields
    (``placement="psld"``, ``replicas=1``, ``worker_gpus=1``...), ``env`` variables
    added to every role's. Each line a role prints goes to ``output``. Blocks until
    the job is over; returns its exit status (0: every worker finished). Raises
    :class:`~trimtab.errors.ConfigError` for settings that cannot work, or without Ray."""
    config = LaunchConfig(
        workers=workers, servers=servers, backend="ray", address=address, **settings
    )
    return Job(config, command, output=output, extra_env=env).run()
