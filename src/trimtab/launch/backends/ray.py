"""The Ray backend: each role of a job a Ray Core actor running the role's own process.

An actor is a place on a node, not the role: it starts the same ``trimtab coordinator``,
``trimtab server`` or worker command the local backend would, on its node, bound on its
node's address, and passes back the process's output and exit status. Tensors never go
through Ray's object store: the roles talk over trimtab's own transport (TCP between
nodes, shared memory and the lane within one). Not Ray Train, which restarts the whole
worker group on any failure: here a dead actor or node is one lost member (the status
:data:`~trimtab.launch.backends.base.LOST_STATUS`), and the job's own recovery
(replicas, elastic workers) applies.

Placement: the coordinator on the driver's node; each server in a placement group of its
own, made when it starts and removed when it ends, so that PSLD's scale-out and scale-in
take and give back one server's resources at a time; workers spread over the nodes.
Roles are placed and started in parallel: starting one returns at once, and its handle
waits (on the thread that reads its output) until Ray has started it.

The job's secret reaches the roles as the path of its file, never as a value: every node
must see that path (the same machine, or a shared file system; docs/engines.md). Ray's
usage statistics are off (``RAY_USAGE_STATS_ENABLED=0``) for every process this starts.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import os
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from trimtab.errors import ConfigError
from trimtab.launch.backends.base import HOST, LOST_STATUS, Backend, RoleHandle, RoleSpec
from trimtab.launch.backends.local import LocalRole, popen_role
from trimtab.launch.procs import lost_with_parent
from trimtab.launch.spec import LaunchConfig

__all__ = ["NAMESPACE", "RayBackend", "RayRole", "RoleActor", "actor_name"]

#: The Ray namespace of every actor a job starts (``ray.get_actor(name, NAMESPACE)``).
NAMESPACE = "trimtab"
#: How long an actor may take to be placed and started.
START_TIMEOUT_S = 120.0

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray's own annotations are partial: it is used untyped here.
ray: Any
_groups: Any  # ray.util.placement_group (the module: ray.util re-exports its function)
_strategies: Any  # ray.util.scheduling_strategies
try:
    ray = importlib.import_module("ray")
    _groups = importlib.import_module("ray.util.placement_group")
    _strategies = importlib.import_module("ray.util.scheduling_strategies")
except ImportError:  # pragma: no cover - said when asked for
    ray = _groups = _strategies = None


def placement_group(bundles: list[dict[str, float]]) -> Any:
    return _groups.placement_group(bundles)


def remove_placement_group(group: Any) -> None:
    _groups.remove_placement_group(group)


#: The variables of the driver's environment a role gets on its node: the job's.
JOB_PREFIXES = ("TRIMTAB_", "DMLC_", "OMP_", "PYTHON", "NCCL_")


def role_variables(env: Mapping[str, str]) -> dict[str, str]:
    """What a role's environment ``env`` (as the launcher made it for this machine)
    adds to its node's own: the variables the launcher set or changed, and the job's
    own (:data:`JOB_PREFIXES`); the rest is the node's (its ``PATH``, ``HOME``...)."""
    own = {k: v for k, v in env.items() if os.environ.get(k) != v or k.startswith(JOB_PREFIXES)}
    own["RAY_USAGE_STATS_ENABLED"] = "0"
    return own


def actor_name(job: str, source: str) -> str:
    """The name of the actor of role ``source`` (``server 1``) of ``job``."""
    return f"trimtab-{job}-{source.replace(' ', '-')}"


class RoleActor:
    """The actor of one role (made a Ray actor class by :class:`RayBackend`): starts the
    role's process on its node and hands its output over in batches. Its methods run on
    several threads of the actor (the output is read while a signal is sent)."""

    def __init__(self) -> None:
        self._role: LocalRole | None = None
        self._lines: collections.deque[bytes] = collections.deque()
        self._cond = threading.Condition()
        self._ended = False

    def node(self) -> tuple[str, str]:
        """(the address of its node, its node id). Never blocks."""
        context = ray.get_runtime_context()
        return ray.util.get_node_ip_address(), context.get_node_id()

    def start(self, argv: list[str], env: Mapping[str, str], cwd: str) -> tuple[str, int]:
        """Start the role's process (:data:`HOST` in ``argv`` this node's address) with
        ``env`` over this node's environment, in ``cwd`` if this node has it; (the
        node's address, the pid). Blocks until it is started."""
        address = ray.util.get_node_ip_address()
        argv = [address if a == HOST else a for a in argv]
        started = threading.Event()
        failed: list[BaseException] = []

        # The process is started by a thread that lives as long as it does: the kernel
        # kills it when that thread ends (PR_SET_PDEATHSIG), so a dead actor's role dies.
        def keep() -> None:
            try:
                self._role = popen_role(
                    argv,
                    {**os.environ, **env},
                    cwd if os.path.isdir(cwd) else None,
                    with_parent=lost_with_parent,
                )
            except BaseException as exc:
                failed.append(exc)
                started.set()
                return
            started.set()
            for line in self._role.lines():
                with self._cond:
                    self._lines.append(line)
                    self._cond.notify_all()
            self._role.popen.wait()
            with self._cond:
                self._ended = True
                self._cond.notify_all()

        threading.Thread(target=keep, daemon=True).start()
        started.wait()
        if failed:
            raise failed[0]
        assert self._role is not None
        return address, self._role.pid

    def read(self, timeout: float) -> tuple[list[bytes], int | None]:
        """The output lines printed since the last call, and the exit status once the
        process ended and every line was passed on. Blocks up to ``timeout`` seconds
        for a line."""
        with self._cond:
            self._cond.wait_for(lambda: self._lines or self._ended, timeout)
            lines = list(self._lines)
            self._lines.clear()
            ended = self._ended
        assert self._role is not None
        return lines, (self._role.poll() if ended else None)

    def signal(self, sig: int, group: bool) -> None:
        """Send ``sig`` to the role (``group``: and what it started). Never raises."""
        if self._role is not None:
            self._role.signal(sig, group)


class RayRole(RoleHandle):
    """A role in a Ray actor, started by ``started`` (the actor's :meth:`RoleActor.start`
    call, still running: roles are placed and started in parallel)."""

    def __init__(self, actor: Any, started: Any, what: str, on_end: Any) -> None:
        self.actor = actor
        self._started = started
        self._what = what  # the resources it asked for, for a message
        #: The address of its node, once it started.
        self.address: str | None = None
        self._failed: str | None = None
        self._code: int | None = None
        self._on_end = on_end

    def poll(self) -> int | None:
        return self._code

    def node(self) -> str | None:
        """Its node's address; blocks until Ray started it (or gave up: None)."""
        if self.address is None and self._failed is None:
            try:
                self.address, _ = ray.get(self._started, timeout=START_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                self._failed = (
                    f"Ray did not start it in {START_TIMEOUT_S:g} s: no node has what it "
                    f"asks ({self._what})"
                )
            except ray.exceptions.RayError as exc:
                self._failed = f"Ray could not start it: {exc}"
        return self.address

    def signal(self, sig: int, group: bool = False) -> None:
        if self._code is None:
            self.actor.signal.remote(sig, group)  # not awaited: never blocks nor raises

    def lines(self) -> Iterator[bytes]:
        try:
            if self.node() is None:
                yield f"trimtab: {self._failed}".encode()
                return
            while True:
                try:
                    lines, code = ray.get(self.actor.read.remote(1.0), timeout=30.0)
                except ray.exceptions.GetTimeoutError:
                    continue  # a busy node: Ray says when it is dead
                yield from lines
                if code is not None:
                    self._code = code
                    return
        except ray.exceptions.RayError:
            self._code = LOST_STATUS  # its actor or its node died: a lost member
        finally:
            if self._code is None:
                self._code = LOST_STATUS
            self._on_end(self)


class RayBackend(Backend):
    """Roles as Ray actors on the cluster at ``address`` (``""``: ``RAY_ADDRESS``, or a
    cluster of this machine's own that :meth:`down` stops), each worker taking
    ``worker_cpus`` CPUs and ``worker_gpus`` GPUs, each server ``server_cpus`` CPUs."""

    name = "ray"

    def __init__(
        self,
        job: str,
        address: str = "",
        worker_cpus: float = 1.0,
        worker_gpus: float = 0.0,
        server_cpus: float = 1.0,
    ) -> None:
        if ray is None:
            raise ConfigError("--backend ray needs Ray: pip install 'trimtab[ray]'")
        self.job = job
        self.address = address
        self.worker_cpus = worker_cpus
        self.worker_gpus = worker_gpus
        self.server_cpus = server_cpus
        self._connected = False
        self._shutdown = False  # whether down() disconnects (up() connected)
        self._lock = threading.Lock()
        self._actors: dict[str, Any] = {}  # live actors by name
        self._groups: dict[str, Any] = {}  # servers' placement groups by actor name
        self._starts: collections.Counter[str] = collections.Counter()

    @classmethod
    def of(cls, config: LaunchConfig) -> RayBackend:
        """The Ray backend ``config`` asks for. Raises :class:`ConfigError` without Ray."""
        c = config
        return cls(c.job, c.address, c.worker_cpus, c.worker_gpus, c.server_cpus)

    def up(self) -> None:
        if ray.is_initialized():  # a Ray driver of the user's: its connection
            self._connected, self._shutdown = True, False
            return
        try:
            ray.init(
                address=self.address or os.environ.get("RAY_ADDRESS") or None,
                namespace=NAMESPACE,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot reach the Ray cluster {self.address!r}: {exc}") from None
        self._connected, self._shutdown = True, True

    def down(self) -> None:
        if not self._connected:
            return
        with self._lock:
            actors, groups = list(self._actors.values()), list(self._groups.values())
            self._actors.clear()
            self._groups.clear()
        for actor in actors:
            with contextlib.suppress(Exception):  # gone already
                ray.kill(actor)
        for group in groups:
            with contextlib.suppress(Exception):
                remove_placement_group(group)
        if self._shutdown:
            ray.shutdown()
        self._connected = False

    def where(self) -> str | None:
        nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")]
        return f"on the Ray cluster of nodes {', '.join(nodes)} (Ray {ray.__version__})"

    def start(self, role: RoleSpec) -> RoleHandle:
        # A role started again (the coordinator's replacement) gets a name of its own.
        self._starts[role.source] += 1
        again = self._starts[role.source]
        name = actor_name(self.job, role.source) + (f"-{again}" if again > 1 else "")
        options: dict[str, Any] = {
            "name": name,
            "namespace": NAMESPACE,  # whatever namespace a user's driver joined
            "max_concurrency": 4,
            "max_restarts": 0,
            "num_cpus": 0,
        }
        group = None
        what = "0 CPUs"
        if role.kind == "coordinator":  # on the driver's node: light, and it stays
            node = ray.get_runtime_context().get_node_id()
            options["scheduling_strategy"] = _strategies.NodeAffinitySchedulingStrategy(
                node, soft=False
            )
        elif role.kind == "server":  # its own placement group: given back when it ends
            group = placement_group([{"CPU": self.server_cpus}])
            options["num_cpus"] = self.server_cpus
            options["scheduling_strategy"] = _strategies.PlacementGroupSchedulingStrategy(group)
            what = f"--server-cpus {self.server_cpus:g}"
        else:
            options.update(
                num_cpus=self.worker_cpus, num_gpus=self.worker_gpus, scheduling_strategy="SPREAD"
            )
            what = f"--worker-cpus {self.worker_cpus:g}, --worker-gpus {self.worker_gpus:g}"
        # Neither call waits: the actor is placed and its process started while the
        # launcher goes on to the next role (the handle waits, on its reader's thread).
        actor = ray.remote(RoleActor).options(**options).remote()
        started = actor.start.remote(list(role.argv), role_variables(role.env), os.getcwd())
        with self._lock:
            self._actors[name] = actor
            if group is not None:
                self._groups[name] = group
        return RayRole(actor, started, what, lambda _: self._ended(name))

    def _ended(self, name: str) -> None:
        """The role of the actor ``name`` ended (or its actor died): give back the actor
        and, for a server, its placement group. Never raises."""
        with self._lock:
            actor = self._actors.pop(name, None)
            group = self._groups.pop(name, None)
        with contextlib.suppress(Exception):  # the cluster may be going away
            if actor is not None:
                ray.kill(actor)
            if group is not None:
                remove_placement_group(group)
