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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.errors import ConfigError, UsageError
from trimtab.frontend.api import default_context
from trimtab.frontend.compression import compressor
from trimtab.frontend.overlap import hook_forward
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.reports import StepReporter
from trimtab.protocol import headers
from trimtab.protocol.messages import INLINE_MAX
from trimtab.roles.server.optim import OptimizerMode, choose_mode, hyperparameters
from trimtab.roles.worker.context import Context
from trimtab.runtime.tensors import wire_dtype
from trimtab.transport.shm import SlotMap

log = logging.getLogger("trimtab")

_said_mode: set[str] = set()


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
        mode: ``"auto"`` (default), ``"server"`` or ``"summation"``. Use summation to
            change gradients between :meth:`synchronize` and :meth:`step` (clipping).
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

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None = None,
        compression: object = None,
        backward_passes_per_step: int = 1,
        op: object = None,
        *,
        mode: str = "auto",
        context: Context | None = None,
        model: torch.nn.Module | None = None,
    ) -> None:
        if op is not None and str(op).lower() not in ("average", "op.average"):
            raise ConfigError(f"only op=Average is supported, got {op!r}")
        if backward_passes_per_step < 1:
            raise ConfigError("backward_passes_per_step must be at least 1")
        self._ctx = ctx = context or default_context()
        self._inner = optimizer
        self._mode = choose_mode(optimizer, mode)
        cls = type(optimizer).__name__
        if cls not in _said_mode:
            _said_mode.add(cls)
            where = (
                "servers apply it to each chunk"
                if self._mode is OptimizerMode.SERVER
                else "servers sum gradients, each worker applies it"
            )
            log.info("trimtab: %s runs in %s mode (%s)", cls, self._mode.value, where)
        # Share the inner optimizer's groups and state, so LR schedulers and user code
        # that touch either object see the same thing.
        super().__init__(
            [{"params": g["params"]} for g in optimizer.param_groups], optimizer.defaults
        )
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        self._passes = backward_passes_per_step
        params = self._name_params(named_parameters)
        self._group_of = {p: g for _, p, g in params}
        self._clock = 0
        self._batch_size = 1.0
        #: Every worker's batch size for the coming step (LB-BSP changes it each step).
        self.batch_sizes: list[int] | None = None
        self.skipped = 0  # gradients not pushed because the coordinator said: refresh
        self.last_compute_s = 0.0  # the last step's compute (step hooks' share included)
        self.last_comm_s = 0.0  # ... and its wait for the servers
        self._counts: dict[torch.Tensor, int] = {}  # backward passes this step
        self._sent_hp: list[dict[str, Any] | None] = [None] * len(self.param_groups)
        self._step_hp: dict[int, dict[str, Any] | None] = {}
        self._synchronized = False
        self._skip_sync = False
        self._overlap = model is not None and self._mode is OptimizerMode.SERVER
        self._pusher = self._declare(params, compression)
        self._reporter = StepReporter(ctx)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
            for p in self._pusher.chunks_of
        ]
        if model is not None and not self._overlap:
            log.info("trimtab: model= has no effect in summation mode (step needs every gradient)")
        if model is not None and self._overlap:
            self._hooks.extend(hook_forward(model, self._pusher))
        ctx.join(self)

    # -- setup ---------------------------------------------------------------------

    def _name_params(
        self, named: Iterable[tuple[str, torch.nn.Parameter]] | None
    ) -> list[tuple[str, torch.Tensor, int]]:
        group_of = {p: g for g, group in enumerate(self.param_groups) for p in group["params"]}
        if named is None:
            pairs = [
                (f"group{g}.param{i}", p)
                for g, group in enumerate(self.param_groups)
                for i, p in enumerate(group["params"])
            ]
        else:
            pairs = list(named)
        names = [n for n, _ in pairs]
        if len(set(names)) != len(names):
            raise ConfigError("named_parameters has duplicate names; names must be unique")
        out = []
        seen = set()
        for name, p in pairs:
            if p not in group_of or p in seen:
                continue  # not optimized (e.g. frozen) or shared under two names
            seen.add(p)
            if p.is_sparse or not p.is_contiguous():
                raise ConfigError(f"parameter {name!r} must be dense and contiguous")
            try:
                wire_dtype(p.dtype)
            except ConfigError as exc:
                raise ConfigError(
                    f"parameter {name!r}: {exc}; leave it out of the optimizer (a buffer, "
                    "or requires_grad=False) or make it floating-point"
                ) from None
            out.append((name, p, group_of[p]))
        missing = [p for p in group_of if p not in seen]
        if missing:
            raise ConfigError(
                f"{len(missing)} optimized parameters are not in named_parameters; pass "
                "model.named_parameters() for the model the optimizer was built on"
            )
        return out

    def _declare(self, params: list[tuple[str, torch.Tensor, int]], compression: object) -> Pusher:
        """Declare the tensors (blocks until every worker did), make the pusher over the
        chunks the job cut them into, and seed the servers with the root's values."""
        ctx = self._ctx
        specs = [TensorSpec(n, tuple(p.shape), wire_dtype(p.dtype), g) for n, p, g in params]
        opt = {
            "cls": type(self._inner).__name__,
            "mode": self._mode.value,
            "groups": [hyperparameters(g) for g in self.param_groups],
        }
        ctx.declare(specs, opt)
        chunks_of: dict[torch.Tensor, list[ChunkSpec]] = {p: [] for _, p, _ in params}
        tensors = [p for _, p, _ in params]
        for c in ctx.chunks:
            chunks_of[tensors[c.tensor]].append(c)
        slots = SlotMap.create(
            ctx.config.job,
            f"w{ctx.rank}",
            ((c.id, c.numel * p.element_size()) for p, cs in chunks_of.items() for c in cs),
            min_bytes=INLINE_MAX,
            enabled=ctx.config.shared_memory,
        )
        pusher = Pusher(
            ctx,
            chunks_of,
            compressor(ctx.compression if compression is None else compression),
            summation=self._mode is OptimizerMode.SUMMATION,
            slots=slots,
            # Per-server timings, for psld only, and not with model=: there replies are
            # read when forward needs them, so when they were read says when compute
            # asked.
            timed=ctx.job.time_servers and not self._overlap,
        )
        pusher.seed(tensors, root_rank=headers.SEED_ROOT)
        return pusher

    # -- the context's member (see roles.worker.context.ContextMember) ---------------

    def drain(self) -> None:
        """:meth:`wait_parameters`, for the context (before a barrier or broadcast)."""
        self._pusher.drain()

    def adopt(self, tensors: Iterable[torch.Tensor], root_rank: int) -> None:
        """Those of ``tensors`` that are our parameters now hold worker ``root_rank``'s
        values (a broadcast): make the servers hold them, and every worker adopt them.
        Collective; blocks."""
        ptrs = {t.data_ptr() for t in tensors}
        params = [p for p in self._pusher.chunks_of if p.data_ptr() in ptrs]
        if params:
            self._pusher.seed(params, root_rank, adoption=True)

    def close(self) -> None:
        """Release this optimizer's shared memory (the worker is leaving). Never raises."""
        self._pusher.close()

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
        if grad is not None and grad.is_sparse:
            raise UsageError("sparse gradients are not supported; use dense embeddings")
        pusher.push(p, grad, self._clock, self._batch_size, self._step_hp[group])

    def synchronize(self) -> None:
        """Push what backward has not pushed yet and wait for every chunk's answer.

        Blocks. In server mode the parameters then hold the updated values; in summation
        mode their ``.grad`` holds the mean gradient over the global batch.
        Raises :class:`~trimtab.JobAborted`, :class:`~trimtab.NodeTimeout`.
        """
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
        the clock. Blocks; raises as :meth:`synchronize`, and what a step hook raises."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        pusher = self._pusher
        # With model=, forward's waits for this step's values were communication.
        forward_waits = pusher.arrive_s
        compute, cpu = self._reporter.compute_so_far(forward_waits)
        for hook in self._ctx.step_hooks:
            compute = hook(self._clock, compute)
        waited = time.perf_counter()
        if not self._synchronized and not self._skip_sync:
            if self._overlap:
                self._send_rest()  # the next forward waits, module by module
            else:
                self.synchronize()
        elif not self._synchronized:
            raise UsageError("skip_synchronize() without synchronize() first")
        comm = time.perf_counter() - waited + forward_waits
        pusher.arrive_s = 0.0
        if self._mode is OptimizerMode.SUMMATION:
            self._inner.step()
        self._synchronized = False
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
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Raises :class:`UsageError` between backward and step."""
        if self._pusher.inflight:
            raise UsageError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(). This is prohibited as it "
                "can cause a race condition."
            )
        self._inner.zero_grad(set_to_none=set_to_none)

    @property
    def clock(self) -> int:
        """Steps this worker has completed."""
        return self._clock

    @property
    def mode(self) -> OptimizerMode:
        return self._mode

    def state_dict(self) -> dict[str, Any]:
        """The inner optimizer's state plus trimtab's (clock, placement epoch)."""
        state = self._inner.state_dict()
        state["trimtab"] = {"clock": self._clock, "epoch": self._pusher.epoch}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the inner optimizer's state. trimtab's clock is not rewound: the
        servers' rounds continue from where this job is."""
        state = dict(state_dict)
        state.pop("trimtab", None)
        self._inner.load_state_dict(state)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r}, mode={self._mode.value})"
