"""Where a job's roles run: one interface (:class:`Backend`), several engines.

- :class:`LocalBackend` (:mod:`.local`): processes of this machine (the default).
- :class:`TestbedBackend` (:mod:`.testbed`): processes in the hosts of a test bed.
- ``RayBackend`` (:mod:`.ray`): Ray Core actors, each running one role's process on its
  node (``pip install 'trimtab[ray]'``; imported only when asked for).
- ``SlurmBackend`` (:mod:`.slurm`): job steps (``srun``) on the nodes of a Slurm
  allocation.

:func:`backend_for` picks the one a :class:`~trimtab.launch.spec.LaunchConfig` says.
"""

from __future__ import annotations

from trimtab.errors import ConfigError
from trimtab.launch.backends.base import HOST, LOST_STATUS, Backend, RoleHandle, RoleSpec
from trimtab.launch.backends.local import LocalBackend, LocalRole
from trimtab.launch.backends.testbed import TestbedBackend
from trimtab.launch.hosts import Layout
from trimtab.launch.spec import LaunchConfig
from trimtab.launch.testbed import Testbed

__all__ = [
    "HOST",
    "LOST_STATUS",
    "Backend",
    "LocalBackend",
    "LocalRole",
    "RoleHandle",
    "RoleSpec",
    "TestbedBackend",
    "backend_for",
]


def backend_for(
    config: LaunchConfig, bed: Testbed | None = None, layout: Layout | None = None
) -> Backend:
    """The backend of ``config`` (``--backend``; ``--testbed N`` or a ``bed`` given: the
    bed's, laid out by ``layout``). Never blocks. Raises :class:`ConfigError` for a
    backend that is not installed here."""
    c = config
    if bed is not None or c.testbed:
        return TestbedBackend(c.servers, c.workers, bed=bed, hosts=c.testbed, layout=layout)
    if c.backend == "ray":
        from trimtab.launch.backends.ray import RayBackend  # needs ray: only when asked

        return RayBackend.of(c)
    if c.backend == "slurm":
        from trimtab.launch.backends.slurm import SlurmBackend

        return SlurmBackend(c.servers)
    if c.backend != "local":
        raise ConfigError(f"unknown backend {c.backend!r}: local, ray or slurm")
    return LocalBackend(c.host)
