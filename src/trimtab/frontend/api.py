"""The Horovod-style module functions: ``init``, ``rank``, ``size``, broadcasts.

This is the edge where a worker's settings are read from the environment (set by
``trimtab run`` or by hand, with DMLC_* names understood too), where fault injection is
wired in (``TRIMTAB_STRAGGLERS``: a step hook on the context; ``TRIMTAB_FAULTS``: a
transport that kills the worker at a step), and the sole owner of the
default :class:`Context`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from trimtab.errors import ConfigError, JobAborted, UsageError
from trimtab.faults.crash import wrap_worker
from trimtab.faults.kills import ENV as FAULTS_ENV
from trimtab.faults.kills import parse_faults
from trimtab.faults.slowdown import WorkerSlowdown
from trimtab.faults.stragglers import ENV as STRAGGLER_ENV
from trimtab.faults.stragglers import StragglerSpec, parse_stragglers
from trimtab.frontend.compression import ENV as COMPRESSION_ENV
from trimtab.frontend.compression import compressor
from trimtab.frontend.state import broadcast_state, zero_missing_grads
from trimtab.frontend.tables import holds_table
from trimtab.protocol import headers
from trimtab.roles.worker.config import WorkerConfig
from trimtab.roles.worker.context import Context
from trimtab.runtime.credit import window_from_env
from trimtab.runtime.diagnostics import add_state_dump, enable_stack_dumps
from trimtab.runtime.trace import Trace, trace_from
from trimtab.transport.auth import auth_from_env
from trimtab.transport.shm import remove_own_arenas
from trimtab.transport.shm import turned_off as shm_turned_off
from trimtab.transport.zmq import ZmqTransport, lane_from_env, spin_from_env

_default: Context | None = None
_forget_state: Callable[[], None] | None = None  # takes the context's state dump back
# The context shutdown() left: its connection stays open (heartbeats) until init() takes
# its place or the process ends (then it says DONE).
_left: Context | None = None
_at_exit_set = False
_trace: Trace | None = None  # TRIMTAB_TRACE's (--trace): one per process, saved at exit
# Why the process is ending badly (an uncaught exception), for the DONE at exit.
_failure: str | None = None


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def config_from_env() -> WorkerConfig:
    """Build a worker's settings from TRIMTAB_* (or DMLC_*) variables.

    Raises :class:`ConfigError` naming the variable to set.
    """
    coordinator = _env("TRIMTAB_COORDINATOR")
    if coordinator is None:
        host, port = _env("DMLC_PS_ROOT_URI"), _env("DMLC_PS_ROOT_PORT")
        if host and port:
            coordinator = f"tcp://{host}:{port}"
    if coordinator is None:
        raise ConfigError(
            "no coordinator to join: run this script under `trimtab run --workers N "
            "--servers S -- python script.py`, or set TRIMTAB_COORDINATOR=tcp://HOST:PORT "
            "(or DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT)"
        )
    rank = _env("TRIMTAB_RANK", "DMLC_WORKER_ID")
    try:
        return WorkerConfig(
            coordinator=coordinator,
            job=_env("TRIMTAB_JOB") or "trimtab",
            rank=int(rank) if rank is not None else -1,
            request_timeout_s=float(
                _env("TRIMTAB_REQUEST_TIMEOUT_S") or WorkerConfig.request_timeout_s
            ),
            coordinator_timeout_s=float(
                _env("TRIMTAB_COORDINATOR_TIMEOUT_S") or WorkerConfig.coordinator_timeout_s
            ),
            spin_s=spin_from_env(os.environ),
            shared_memory=not shm_turned_off(os.environ),
            credit_bytes=window_from_env(os.environ),
            # (TRIMTAB_PRIORITY=0, the servers' arrival order, holds pushes in theirs too)
            credit_ordered=os.environ.get("TRIMTAB_PRIORITY", "1") != "0",
        )
    except ValueError as exc:
        raise ConfigError(f"bad TRIMTAB_* setting: {exc}") from None


def init(config: WorkerConfig | None = None) -> None:
    """Join the job as a worker. Blocks until registered with the coordinator.

    Call before anything else of trimtab's; a second call does nothing. After
    :func:`shutdown` it joins the job again under the same rank (as Horovod allows):
    a :class:`DistributedOptimizer` built again over the same parameters, in the same
    order, goes on from the servers' values and optimizer state and from this
    worker's clock, whether the other workers re-initialised too or not. Settings come
    from the environment unless ``config`` is given. Raises :class:`ConfigError` if
    there is no coordinator to join or no readable secret file (``TRIMTAB_SECRET_FILE``,
    which ``trimtab run`` sets), :class:`NodeTimeout` if it does not answer,
    :class:`JobAborted` if the job ended meanwhile.
    """
    global _default, _left, _forget_state, _at_exit_set, _trace
    if _default is not None:
        return
    if _left is not None and _left.client.dead is not None:
        raise JobAborted(f"the job ended after this worker's shutdown(): {_left.client.dead}")
    config = config or config_from_env()
    if _left is not None and config.rank < 0:
        config = dataclasses.replace(config, rank=_left.rank)  # its own rank, kept for it
    local_rank = int(os.environ.get("TRIMTAB_LOCAL_RANK", "-1"))
    stragglers = parse_stragglers(os.environ.get(STRAGGLER_ENV, ""))
    compression = compressor(os.environ.get(COMPRESSION_ENV) or "none").name
    ctx = Context(
        config,
        local_rank=local_rank,
        compression=compression,
        transport=wrap_worker(  # --fault: a worker killed at a step (itself, untouched)
            ZmqTransport(
                bind=False, lane=lane_from_env(os.environ), auth=auth_from_env(os.environ)
            ),
            parse_faults(os.environ.get(FAULTS_ENV, "")),
            config.job,
        ),
    )
    if _left is not None:  # registered in its place: the old connection may go
        ctx.take_over(_left)
        _left.close(done=False)
        _left = None
    _default = ctx
    if _trace is None and (_trace := trace_from(os.environ, f"worker-{ctx.rank}")) is not None:
        atexit.register(_trace.save)  # (before _at_exit's: it runs after it)
    ctx.client.trace = _trace  # TRIMTAB_TRACE (--trace): its pushes and values, its clock
    add_stragglers(ctx, stragglers)
    if not _at_exit_set:
        atexit.register(_at_exit)
        _watch_failures()
        _remove_arenas_on_sigterm()
        _at_exit_set = True
    enable_stack_dumps()  # kill -USR1 prints where this worker is (a hung job)
    _forget_state = add_state_dump(ctx.describe)


def add_stragglers(ctx: Context, specs: Sequence[StragglerSpec]) -> None:
    """Emulate the slowdowns ``specs`` (``--straggler``) give this worker, as a step
    hook on ``ctx`` (closed with it). Does nothing if none is this worker's. Blocks
    until registered; raises nothing of its own."""
    slowdown = WorkerSlowdown(specs, ctx.rank)
    if slowdown:
        ctx.add_step_hook(slowdown, close=slowdown.close)


def shutdown() -> None:
    """Step out of the job: write what the optimizers are still owed, release them, and
    tell the coordinator (LEAVE) with their clocks. The job keeps this worker's rank,
    and :func:`init` may join it again; the process keeps a connection open
    (heartbeats) and says it is done when it exits, and the job ends once every
    worker's process did. Idempotent. Blocks briefly; never raises."""
    global _default, _left
    if _default is not None:
        ctx, _default = _default, None
        if _forget_state is not None:
            _forget_state()
        ctx.leave()
        _left = ctx


def _watch_failures() -> None:
    """Chain ``sys.excepthook``: an exception that ends the script is remembered, so
    that :func:`_at_exit` tells the job this worker failed (the job ends at once)
    rather than that it is done (the others would wait for it until their requests
    time out). ``sys.exit(n)`` is an exit, not a failure: the hook does not see it."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: types.TracebackType | None) -> None:
        global _failure
        _failure = f"{kind.__name__}: {exc}" if str(exc) else kind.__name__
        previous(kind, exc, tb)

    sys.excepthook = hook


def _remove_arenas_on_sigterm() -> None:
    """Where SIGTERM would end the process at once (its default, as when a launcher
    killed outright stops its children), remove this worker's shared memory first,
    then die of SIGTERM as before: atexit handlers do not run then. A handler the
    script set is left alone."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def terminated(signum: int, frame: types.FrameType | None) -> None:
        remove_own_arenas()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, terminated)


def _at_exit() -> None:
    """The process ends: tell the job this worker is done (DONE), whether it called
    :func:`shutdown` or not, or that it failed (an uncaught exception), and close its
    connection. Never raises."""
    global _default, _left
    ctx = _default or _left
    _default = _left = None
    if ctx is not None:
        if _forget_state is not None:
            _forget_state()
        ctx.close(failed=_failure)


def is_initialized() -> bool:
    """Whether :func:`init` joined the job (and :func:`shutdown` has not left it)."""
    return _default is not None


def default_context() -> Context:
    """The context ``init()`` made. Raises :class:`UsageError` before ``init()``."""
    if _default is None:
        raise UsageError("call trimtab.init() first")
    return _default


def rank() -> int:
    """This worker's rank, 0 .. size()-1."""
    return default_context().rank


def size() -> int:
    """The number of workers in the job."""
    return default_context().size


def local_rank() -> int:
    """This worker's rank among the workers on its machine."""
    return default_context().local_rank


def local_size() -> int:
    """Workers on this machine (``TRIMTAB_LOCAL_SIZE``; all of them when unset)."""
    return int(os.environ.get("TRIMTAB_LOCAL_SIZE", size()))


def cross_rank() -> int:
    """This worker's machine, 0 .. cross_size()-1 (``TRIMTAB_CROSS_RANK``, set where
    workers were started on several machines; 0 otherwise). Raises :class:`UsageError`
    before ``init()``."""
    default_context()
    return _env_int("TRIMTAB_CROSS_RANK", 0)


def cross_size() -> int:
    """The machines the job's workers run on (``TRIMTAB_CROSS_SIZE``; 1 when unset, as
    under ``trimtab run``). Raises :class:`UsageError` before ``init()``."""
    default_context()
    return _env_int("TRIMTAB_CROSS_SIZE", 1)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} must be a whole number") from None


def server_stats() -> list[dict[str, Any]]:
    """Each server's counters: chunk versions, pushes (``shared``: those whose gradient
    came through a worker's shared memory), dropped and discounted gradients, errors
    answered. Blocks (one round trip per server)."""
    return default_context().server_stats()


def job_status() -> dict[str, Any]:
    """The coordinator's view of the job: members, placement epoch and owners, worker
    clocks, migrations done, bytes moved, measured server speeds (``speeds``: bytes per
    busy second; ``worker_speeds``: the workers' lower and upper bounds, under psld).
    Blocks (one round trip); raises :class:`~trimtab.JobAborted` if the job is over."""
    reply = default_context().call(headers.status_request()).header
    return dict(headers.read_status_reply(reply))


def start_step() -> int:
    """The step this worker's training goes on from: 0 for a fresh job; for a job
    resumed from a checkpoint (``trimtab run --resume DIR``), the checkpoint's clock, the
    steps before it being done (skip them: their data too). Known once the first
    :class:`~trimtab.DistributedOptimizer` is built (its construction waits until the
    servers hold the checkpoint's values); the same as that optimizer's ``clock`` then.
    Never blocks. Raises :class:`UsageError` before ``init()`` or before any
    DistributedOptimizer was built."""
    tables = default_context().tables
    if not tables:
        raise UsageError(
            "trimtab.start_step() is known once a DistributedOptimizer is built: build "
            "it first (its construction is where a resumed job's clock arrives)"
        )
    return tables[0].clock or 0


def barrier() -> None:
    """Block until every worker calls ``barrier()``."""
    default_context().barrier()


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int = 0
) -> None:
    """Overwrite ``params`` (a ``state_dict()`` or ``named_parameters()``) on every worker
    with the values of ``root_rank``. Collective and blocking; if a
    :class:`DistributedOptimizer` holds some of them, the servers adopt them too."""
    tensors = dict(params.items()) if isinstance(params, Mapping) else dict(params)
    # (A table on the servers has no values here: trimtab.nn's, left out.)
    tensors = {name: t for name, t in tensors.items() if not holds_table(t)}
    default_context().broadcast(tensors, root_rank)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Give every worker the optimizer state of ``root_rank``: every hyperparameter
    (numbers, bools, tuples such as Adam's betas, None, strings, tensors) and the state,
    also on a worker whose optimizer has none yet (a fresh job resuming a checkpoint
    that rank 0 loaded). A :class:`DistributedOptimizer` in server mode keeps its state
    on the servers, where rank 0's ``load_state_dict()`` put it: only the
    hyperparameters travel, and the call ends with a barrier, so that no worker's next
    step precedes the root's load. As Horovod's does, it leaves each trained parameter
    of an optimizer with a fresh state a zero ``.grad`` where it had none (Horovod's
    zero-gradient step itself is not taken: the state stays torch's fresh one).
    Collective and blocking; raises
    :class:`UsageError` between backward and step, and torch's ``ValueError`` for
    optimizers of different param groups."""
    own = getattr(optimizer, "broadcast_state", None)
    if callable(own):  # a DistributedOptimizer (not imported here: it imports this module)
        own(root_rank)
        return
    if not optimizer.state:
        zero_missing_grads(optimizer)
    broadcast_state(default_context(), optimizer, root_rank, groups_only=False)
