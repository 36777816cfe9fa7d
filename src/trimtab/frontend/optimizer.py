"""``trimtab.DistributedOptimizer``: Horovod's optimizer contract over a parameter server.

It holds the user's optimizer (composition: the class is never generated at run time).
Gradient hooks push each parameter's chunks to their servers as soon as backward has
accumulated them; :meth:`synchronize` waits for the servers' answers. In *server* mode
the answers are the updated values (the servers ran the user's optimizer), in
*summation* mode the averaged gradients, to which the user's optimizer is applied here.

The optimizer is the contract only: the chunks travel through a
:class:`~trimtab.frontend.pusher.Pusher`, the step's measurements through a
:class:`~trimtab.frontend.reports.StepReporter`, and ``model=``'s forward hooks are
:mod:`trimtab.frontend.overlap`'s.
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from trimtab.errors import ConfigError, UsageError
from trimtab.frontend.api import default_context
from trimtab.frontend.declaration import declare_table
from trimtab.frontend.marks import marked
from trimtab.frontend.meangrad import MeanGrads
from trimtab.frontend.overlap import hook_forward
from trimtab.frontend.params import RESYNC_WARNING, name_params, reduction, say_mode, trained
from trimtab.frontend.probe import Mark, check_marks, end_probe, marks_of
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.reports import StepReporter
from trimtab.frontend.rows import check_layout
from trimtab.frontend.state import (
    broadcast_state,
    by_index,
    by_param,
    gather,
    scatter,
    zero_missing_grads,
)
from trimtab.frontend.tables import is_table
from trimtab.roles.server.optim import OptimizerMode, choose_mode, hyperparameters
from trimtab.roles.worker.context import Context

log = logging.getLogger("trimtab")


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer`` so that each step is one synchronous parameter-server step.

    Args:
        optimizer: the user's torch optimizer (any; SGD, Adam, AdamW, Adagrad, RMSprop and
            Adamax run on the servers, others in summation mode).
        named_parameters: ``model.named_parameters()``; names must match across workers.
            Without it, parameters are named by their place in the param groups.
        compression: how gradients travel: ``trimtab.Compression.fp16`` or ``.bf16``
            halve a float32 push (values come back in full precision); default the job's
            (``trimtab run --compression``), else none.
        backward_passes_per_step: backward passes accumulated locally before a push.
        op: how gradients combine over workers: ``trimtab.Average`` (default; the mean
            weighted by each worker's :attr:`batch_size`) or ``trimtab.Sum``: the
            number of workers times that mean, which is Horovod's sum of the workers'
            gradients when batch sizes are equal. Under unequal (LB-BSP) batch sizes
            Sum stays ``size()`` times the mean gradient over the global batch, not a
            sum weighted by the split. Horovod's ints (0, 1) are taken; Adasum is not.
        gradient_predivide_factor: with op=Average, each gradient is divided by it
            before the push and the servers' mean multiplied by it (Horovod's split of
            the averaging, for half-precision ranges): the same mean. Not with op=Sum.
        mode: ``"auto"`` (default), ``"server"`` or ``"summation"``. In auto, a job
            whose script calls :meth:`synchronize` itself in its first step (to clip or
            unscale gradients before :meth:`step`) runs in summation mode, so that the
            update uses the changed gradients, as Horovod's does; in server mode, a
            gradient changed between :meth:`synchronize` and :meth:`step` raises
            :class:`UsageError`.
        context: the worker context; the one made by ``trimtab.init()`` by default.
        model: the module these parameters belong to. With it (server mode), :meth:`step`
            returns once the last gradients are sent, and the next forward pass waits
            per module, each for its own parameters' new values, so that it overlaps the
            step's communication (P3, BytePS's cross-barrier); servers answer the first
            layers first. Each parameter must then be used in the forward of a module
            that holds it; read parameters outside forward only after
            :meth:`wait_parameters`, ``model(...)``, ``model.state_dict()`` or
            ``trimtab.barrier()``.

    Construction blocks until every worker built its optimizer over the same tensors and
    the servers hold the root's initial values, which every worker then adopts.
    Not thread-safe: call from the training thread. Raises :class:`ConfigError` for
    unsupported parameters, :class:`RemoteError` if workers declare different tensors,
    :class:`UsageError` before ``trimtab.init()`` without ``context``.
    """

    _reporter: StepReporter

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        compression: object = None,
        backward_passes_per_step: int = 1,
        op: object = None,
        gradient_predivide_factor: float = 1.0,
        *,
        mode: str = "auto",
        context: Context | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        self._op, self._predivide = reduction(op, gradient_predivide_factor)
        if backward_passes_per_step < 1:
            raise ConfigError("backward_passes_per_step must be at least 1")
        self._ctx = ctx = context or default_context()
        self._inner = optimizer
        self._mode = choose_mode(optimizer, mode)
        say_mode(optimizer, self._mode)
        # The inner optimizer's groups and state shared: LR schedulers and users see one.
        super().__init__(
            [{"params": g["params"]} for g in optimizer.param_groups], optimizer.defaults
        )
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        self._passes = backward_passes_per_step
        params = name_params(self.param_groups, named_parameters)
        self._group_of = {p: g for _, p, g in params}
        self._clock = 0
        self._batch_size = 1.0
        #: Every worker's batch size for the coming step (LB-BSP changes it each step).
        self.batch_sizes: list[int] | None = None
        self.skipped = 0  # gradients not pushed because the coordinator said: refresh
        self.last_compute_s = 0.0  # the last step's compute (step hooks' share included)
        self.last_comm_s = 0.0  # ... and its wait for the servers
        self._counts: dict[torch.Tensor, int] = {}  # backward passes this step
        self._layouts: set[tuple[int, bool]] = set()  # (group, sparse) torch accepts
        self._sent_hp: list[dict[str, Any] | None] = [None] * len(self.param_groups)
        self._step_hp: dict[int, dict[str, Any] | None] = {}
        self._synchronized = False
        self._skip_sync = False
        self._loaded = False  # load_state_dict() was called (server mode: state is there)
        self._explicit = False  # the script called synchronize() itself this step
        # Server mode, after an explicit synchronize(): each gradient and its version,
        # to see whether the script changed one before step().
        self._marks: list[Mark] | None = None
        self._overlap = model is not None and self._mode is OptimizerMode.SERVER
        self._pusher = self._declare(params, compression)
        # The first step probes whether the script changes gradients between
        # synchronize() and step() (see _end_probe): where the job may switch modes. An
        # optimizer built again after init() (its table known) goes on as it was.
        # (A table on the servers never is on a worker: no worker can apply its update.)
        self._probing = (
            mode == "auto"
            and not any(is_table(p) for _, p, _ in params)
            and self._mode is OptimizerMode.SERVER
            and ctx.job.consistency == "bsp"
            and not self._again
        )
        self._pusher.mean_only = self._probing
        self._pusher.summation = self._mode is OptimizerMode.SUMMATION or self._probing
        # One REPORT per worker and step: the first optimizer's (see reports.py).
        first = [m for m in ctx.members if isinstance(m, DistributedOptimizer) and m.table == 0]
        sender = first[0]._reporter if first and self._table else None
        self._reporter = StepReporter(ctx, sender=sender)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
            for p in self._pusher.chunks_of
        ]
        # Server mode under BSP: .grad after step() is the mean (meangrad.py).
        self._means = None
        if self._mode is OptimizerMode.SERVER and ctx.job.consistency == "bsp":
            self._means = MeanGrads(self._pusher)
        if model is not None and not self._overlap:
            log.info("trimtab: model= has no effect in summation mode (step needs every gradient)")
        if model is not None and self._overlap:
            self._hooks.extend(hook_forward(model, self._pusher))
        ctx.join(self)

    # -- setup ---------------------------------------------------------------------

    def _declare(self, params: list[tuple[str, torch.Tensor, int]], compression: object) -> Pusher:
        """:func:`~trimtab.frontend.declaration.declare_table` for this optimizer, and the
        clock of a table the job has already (built again after ``init()``)."""
        pusher, table = declare_table(
            self._ctx,
            self._inner,
            params,
            mode=self._mode,
            compression=compression,
            op=self._op,
            predivide=self._predivide,
            overlap=self._overlap,
        )
        self._table = table.index
        self._again = table.clock is not None
        if table.clock is not None:
            self._clock = table.clock
        if table.sizes:  # joined a running job: its share of its first step
            self.batch_sizes = list(table.sizes)
            self._batch_size = float(table.sizes[self._ctx.rank])
        return pusher

    # -- the context's member (see roles.worker.context.ContextMember) ---------------

    def drain(self) -> None:
        """:meth:`wait_parameters`, for the context (before a barrier or broadcast), and
        the last step's report sent (there the coordinator knows every step)."""
        self._pusher.drain()
        self._reporter.send_now()

    def adopt(self, tensors: Iterable[torch.Tensor], root_rank: int) -> None:
        """Those of ``tensors`` that are our parameters now hold worker ``root_rank``'s
        values (a broadcast): make the servers hold them, and every worker adopt them.
        Collective; blocks."""
        ptrs = {t.data_ptr() for t in tensors}
        params = [p for p in self._pusher.chunks_of if p.data_ptr() in ptrs and not is_table(p)]
        if params:
            self._pusher.seed(params, root_rank, adoption=True)

    def close(self) -> None:
        """Send the last step's report, take the hooks off the parameters (an optimizer
        built over them after ``init()`` again pushes alone) and give them back their
        class, release the shared memory (the worker is leaving). A mean gradient owed
        is forgotten: ``.grad`` keeps this worker's own. Never raises."""
        self._reporter.flush()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._means is not None:
            self._means.close()
        self._pusher.close()

    @property
    def table(self) -> int:
        """This optimizer's table: the job's n-th DistributedOptimizer, from 0."""
        return self._table

    def describe(self) -> str:
        """Where this optimizer stands, for a hung job's dump (:data:`STACK_SIGNAL`): its
        clock and the chunk requests not yet answered. Only reads; never blocks."""
        return f"  optimizer: clock {self._clock}, {self._pusher.describe()}"

    # -- the training step -----------------------------------------------------------

    @property
    def batch_size(self) -> float:
        """This worker's batch size for the coming step: its gradient's weight, so that
        the servers' update is the mean over the global batch. Default 1 (equal)."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: float) -> None:
        if not value > 0:
            raise ConfigError(f"batch_size must be positive, got {value}")
        if self._pusher.inflight:
            raise UsageError("set batch_size before backward, not between backward and step")
        self._batch_size = float(value)

    def _on_grad(self, p: torch.Tensor) -> None:
        if self._synchronized:  # synchronize() then no step(): GradScaler skipped it
            self._finish(apply=False)
        count = self._counts.get(p, 0) + 1
        self._counts[p] = count
        if count < self._passes:
            return
        if count > self._passes:
            raise UsageError(
                f"gradients were computed {count} times before step(), more than "
                f"backward_passes_per_step={self._passes}; raise backward_passes_per_step "
                "or call step() after each backward"
            )
        self._push(p, p.grad)

    def _push(self, p: torch.Tensor, grad: torch.Tensor | None) -> None:
        pusher = self._pusher
        if p in pusher.arriving:  # not used in a hooked forward: its answer lands now
            pusher.arrive([p])
        reporter = self._reporter
        reporter.before_push(not pusher.inflight, self._clock)
        if reporter.skipping:
            return
        group = self._group_of[p]
        if group not in self._step_hp:
            hp = hyperparameters(self.param_groups[group])
            self._step_hp[group] = None if hp == self._sent_hp[group] else hp
            self._sent_hp[group] = hp
        layout = (group, grad is not None and grad.is_sparse)
        if grad is not None and layout not in self._layouts:  # torch's refusal, if any
            check_layout(self._inner, self.param_groups[group], layout[1])
            self._layouts.add(layout)
        if layout[1]:
            assert grad is not None
            pusher.push_rows(p, grad, self._clock, self._batch_size, self._step_hp[group])
            return
        pusher.push(p, grad, self._clock, self._batch_size, self._step_hp[group])

    def synchronize(self) -> None:
        """Push what backward has not pushed yet and wait for every chunk's answer.

        Blocks. In summation mode (and in a job's first step, see ``mode``) the
        parameters' ``.grad`` then holds the mean gradient over the global batch, which
        the script may change before ``step()`` (within :meth:`skip_synchronize`); in
        server mode the parameters hold the updated values.
        Raises :class:`~trimtab.JobAborted`, :class:`~trimtab.NodeTimeout`.
        """
        with marked("trimtab.synchronize"):  # in a user's torch profile (marks.py)
            self._synchronize()
        self._explicit = True
        if self._mode is OptimizerMode.SERVER and not self._probing:
            self._marks = marks_of(list(self._pusher.chunks_of))

    def _synchronize(self) -> None:
        self._send_rest()
        self.wait_parameters()
        self._synchronized = True

    def _send_rest(self) -> None:
        """Push what backward has not pushed; the step's answers are then arriving."""
        for p in self._pusher.chunks_of:
            if p not in self._pusher.inflight:
                self._push(p, p.grad)
        if self._reporter.skipping:
            self._skip_ahead()
            return
        self._pusher.seal(self._clock)
        self._counts.clear()
        self._step_hp.clear()

    def wait_parameters(self) -> None:
        """Block until every answer of the steps taken so far is written: the updated
        values in server mode (needed with ``model=`` before reading parameters outside
        forward), the mean gradients in summation mode.
        Raises :class:`~trimtab.JobAborted`, :class:`~trimtab.NodeTimeout`."""
        self._pusher.drain()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block, :meth:`step` does not synchronize (you already did)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def refresh(self) -> None:
        """Replace the parameters with the servers' current values (server mode). Blocks.

        Useful in asynchronous modes, e.g. before evaluating at the end of training.
        Raises :class:`UsageError` between backward and step, or in summation mode."""
        if self._pusher.inflight:
            raise UsageError("refresh() between backward and step(); call step() first")
        self.wait_parameters()
        if self._mode is OptimizerMode.SUMMATION:
            raise UsageError(
                "refresh() needs server mode: in summation mode the workers, "
                "not the servers, hold the parameters"
            )
        self._pusher.pull(list(self._pusher.chunks_of))

    def _skip_ahead(self) -> None:
        """Drop this step's (stale) gradients, fetch current values, jump the clock to
        one behind the leading worker's (SaPS's directive)."""
        self._pusher.inflight.clear()
        if self._mode is OptimizerMode.SERVER:
            self.refresh()
        clock = max(self._clock, self._reporter.lead - 1)
        log.info(
            "worker %d lagged: skipped its stale gradient, clock %d -> %d",
            self._ctx.rank,
            self._clock,
            clock,
        )
        self.skipped += 1
        self._clock = clock
        self._reporter.skipping = False
        self._counts.clear()
        self._step_hp.clear()
        self._synchronized = True

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Finish the step: run the context's step hooks, synchronize (unless done; with
        ``model=``, only send), apply the update, report the step's timings to the
        coordinator (and, under LB-BSP, learn every worker's next batch size), advance
        the clock. Blocks; raises as :meth:`synchronize`, what a step hook raises, and
        :class:`UsageError` where the update cannot be the one asked for (a gradient
        changed after :meth:`synchronize` in server mode)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._synchronized and not self._skip_sync:
            # Horovod synchronizes again here; the answers are in, so nothing is pushed.
            warnings.warn(RESYNC_WARNING, stacklevel=2)
        with marked("trimtab.step"):  # in a user's torch profile (marks.py)
            self._finish(apply=True)
        return loss

    def _finish(self, apply: bool) -> None:
        """The step's end (``apply``: step() was called, else GradScaler skipped it)."""
        pusher = self._pusher
        # With model=, forward's waits for this step's values were communication.
        forward_waits = pusher.arrive_s
        compute, cpu = self._reporter.compute_so_far(forward_waits)
        for hook in self._ctx.step_hooks:
            compute = hook(self._clock, compute)
        waited = time.perf_counter()
        if not self._synchronized and not self._skip_sync:
            if self._overlap and not self._probing:
                self._send_rest()  # the next forward waits, module by module
            else:
                self._synchronize()
        elif not self._synchronized:
            raise UsageError("skip_synchronize() without synchronize() first")
        comm = time.perf_counter() - waited + forward_waits
        pusher.arrive_s = 0.0
        if self._probing:
            self._probing = False
            if end_probe(self._ctx, pusher, self._inner, self._explicit, apply):
                self._mode = OptimizerMode.SUMMATION
        elif self._mode is OptimizerMode.SUMMATION:
            if apply:
                self._inner.step()
        else:
            check_marks(self._marks, apply)
            if self._means is not None:
                self._means.stepped()
        self._synchronized = self._explicit = False
        self._marks = None
        self.last_compute_s, self.last_comm_s = compute, comm
        sizes = self._reporter.end_step(
            self._clock,
            int(self._batch_size),
            compute,
            comm,
            cpu,
            pusher.take_traffic(),
            waited,
        )
        if sizes is not None:
            self.batch_sizes = sizes
            self._batch_size = float(sizes[self._ctx.rank])
        self._clock += 1

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Raises :class:`UsageError` between backward and step."""
        if self._pusher.inflight:
            raise UsageError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
                "can cause a race condition."
            )
        if self._synchronized:  # synchronize() then no step(): GradScaler skipped it
            self._finish(apply=False)
        if self._means is not None:
            self._means.forget()  # (torch's zero_grad reads .grad: nothing to fetch)
        self._inner.zero_grad(set_to_none=set_to_none)

    @property
    def clock(self) -> int:
        """Steps this worker has completed."""
        return self._clock

    @property
    def mode(self) -> OptimizerMode:
        return self._mode

    # -- state -----------------------------------------------------------------------

    def _between_steps(self, what: str) -> None:
        if self._pusher.inflight or self._synchronized:
            raise UsageError(f"{what} between backward and step(): call it after step()")
        self.wait_parameters()

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's ``state_dict()``, in its own layout (``state`` by
        parameter index, ``param_groups``), plus trimtab's (``"trimtab"``: clock,
        placement epoch). In server mode the state is read from the servers (one round
        trip per chunk); no other worker takes part, so rank 0 may call it alone.
        Blocks; raises :class:`UsageError` between backward and step."""
        self._between_steps("state_dict()")
        state = self._inner.state_dict()
        if self._mode is OptimizerMode.SERVER:
            state["state"] = by_index(gather(self._pusher, self._pusher.chunks_of), self._params())
        state["trimtab"] = {"clock": self._clock, "epoch": self._pusher.epoch}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a ``state_dict()`` (this class's or the wrapped one's): hyperparameters
        here, state here (summation mode) or on the servers, acknowledged before this
        returns. Rank 0 alone (then :func:`trimtab.broadcast_optimizer_state`) or every
        worker with the same dict: the same result. The clock is not rewound. Blocks;
        raises :class:`UsageError` between backward and step, torch's ``ValueError``."""
        self._between_steps("load_state_dict()")
        state = {k: v for k, v in state_dict.items() if k != "trimtab"}
        if self._mode is OptimizerMode.SUMMATION:
            self._inner.load_state_dict(state)
            self._share_inner()
            return
        self._inner.load_state_dict({"state": {}, "param_groups": state["param_groups"]})
        self._share_inner()
        # A parameter the dict holds no state for (a fresh optimizer's, SGD without
        # momentum's) starts again from a fresh state, as torch's load leaves it.
        groups = {p: self.param_groups[self._group_of[p]] for p in self._pusher.chunks_of}
        scatter(self._pusher, by_param(state, self._params()), groups)
        self._loaded = True

    def broadcast_state(self, root_rank: int) -> None:
        """:func:`trimtab.broadcast_optimizer_state`: worker ``root_rank``'s
        hyperparameters (of any type) and, in summation mode, state, on every worker
        (in server mode the servers hold the one state). Ends with a barrier, so no
        worker's next push precedes it. Collective; blocks."""
        self._between_steps("broadcast_optimizer_state()")
        summation = self._mode is OptimizerMode.SUMMATION
        # Horovod's test for a fresh optimizer: no state yet (in server mode: no step
        # taken, nothing loaded, since the servers hold it).
        fresh = not self._inner.state if summation else self._clock == 0 and not self._loaded
        if fresh:
            zero_missing_grads(self._inner)
        broadcast_state(self._ctx, self._inner, root_rank, groups_only=not summation)
        self._share_inner()
        self._ctx.barrier()

    def _params(self) -> list[torch.Tensor]:  # in torch's state_dict order
        return [p for g in self.param_groups for p in g["params"]]

    def _share_inner(self) -> None:
        # torch's load_state_dict makes new param group dicts: share them again.
        self.param_groups = self._inner.param_groups
        self.state = self._inner.state
        self._group_of = {
            p: g for g, group in enumerate(self.param_groups) for p in group["params"] if trained(p)
        }

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r}, mode={self._mode.value})"
