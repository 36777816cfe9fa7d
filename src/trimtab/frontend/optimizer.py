"""``trimtab.DistributedOptimizer``: Horovod's optimizer contract over a parameter server.

It holds the user's optimizer (composition: the class is never generated at run time).
Gradient hooks push each parameter's chunks to their servers as soon as backward has
accumulated them; :meth:`synchronize` waits for the servers' answers. In *server* mode
the answers are the updated values (the servers ran the user's optimizer), in
*summation* mode the averaged gradients, to which the user's optimizer is applied here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ChunkMoved, ConfigError, RemoteError, UsageError
from trimtab.frontend.compression import compressor
from trimtab.protocol.messages import INLINE_MAX, Control, Data, ErrorCode, inline
from trimtab.roles.server.optim import OptimizerMode, choose_mode, hyperparameters
from trimtab.roles.worker.client import Reply, wait
from trimtab.roles.worker.context import Context
from trimtab.runtime.tensors import as_bytes, tensor_from, wire_dtype
from trimtab.transport.shm import Arena, is_local
from trimtab.transport.shm import enabled as shm_enabled

log = logging.getLogger("trimtab")

#: A request whose chunk moved this many times in a row gives up.
_MAX_MOVES = 8
#: Values of chunks up to this size are written into the parameter as bytes (a slice of
#: a byte view kept per parameter: about 1 us) rather than through a torch slice and
#: copy_ (about 13 us of dispatch here); above it torch's copy is the faster (4 MiB:
#: 99 us against 127).
_BYTE_WRITE_MAX = 64 * 1024

# A chunk request: its future, header and frames (kept to resend it if the chunk moved)
# and the index of the server it went to.
#: A chunk's push in flight: its reply's future, header, frames, the server it was sent
#: to and the gradient bytes it carried.
_Sent = tuple[concurrent.futures.Future[Reply], dict[str, Any], list[Any], int, int]
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
    unsupported parameters, :class:`RemoteError` if workers declare different tensors.
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
        from trimtab.frontend.api import default_context

        if op is not None and str(op).lower() not in ("average", "op.average"):
            raise ConfigError(f"only op=Average is supported, got {op!r}")
        if backward_passes_per_step < 1:
            raise ConfigError("backward_passes_per_step must be at least 1")
        self._ctx = context or default_context()
        self._compression = compressor(
            self._ctx.compression if compression is None else compression
        )
        # One reused wire buffer per parameter whose gradients are narrowed for the push.
        self._wire: dict[torch.Tensor, torch.Tensor] = {}
        # A byte view of each parameter's memory, with the address it was made for.
        self._bytes_of: dict[torch.Tensor, tuple[int, memoryview]] = {}
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
        self._versions: dict[int, int] = {}  # chunk id -> version of the value we hold
        self._params = self._name_params(named_parameters)
        self._declare()
        self._clock = 0
        self._batch_size = 1.0
        #: Every worker's batch size for the coming step (LB-BSP changes it each step).
        self.batch_sizes: list[int] | None = None
        self.skipped = 0  # gradients not pushed because the coordinator said: refresh
        self.last_compute_s = 0.0  # the last step's compute (emulated slowdown included)
        self.last_comm_s = 0.0  # ... and its wait for the servers
        self._directive: concurrent.futures.Future[Reply] | None = None
        self._skipping = False
        self._lead = 0
        self._step_started = time.perf_counter()
        self._cpu_started = time.process_time()
        self._pending_report: tuple[int, int, float, float, float, list[list[float]]] | None = None
        # This step's traffic per server: [first push sent, last reply read, bytes both
        # ways], for PSLD's worker-observed speeds (see _spans_of_step).
        self._traffic: dict[int, list[float]] = {}
        self._next_report = 0.0
        self._report_future: concurrent.futures.Future[Reply] | None = None
        self._counts: dict[torch.Tensor, int] = {}
        self._inflight: dict[torch.Tensor, list[_Sent]] = {}
        # Sent, answers not yet written: parameter -> (its requests, their clock).
        self._arriving: dict[torch.Tensor, tuple[list[_Sent], int]] = {}
        self._arrive_s = 0.0  # time forward spent waiting for values, this step
        # The request being waited for (chunk, request id, clock), for describe().
        self._awaited: tuple[int, int, int | None] | None = None
        self._sent_hp: list[dict[str, Any] | None] = [None] * len(self.param_groups)
        self._step_hp: dict[int, dict[str, Any] | None] = {}
        self._synchronized = False
        self._skip_sync = False
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._on_grad)  # type: ignore[no-untyped-call]
            for p in self._chunks_of
        ]
        self._overlap = model is not None and self._mode is OptimizerMode.SERVER
        # Per-server timings, for psld only, and not with model=: there replies are read
        # when forward needs them, so when they were read says when compute asked.
        self._timed = bool(self._ctx.job.get("time_servers")) and not self._overlap
        if model is not None and not self._overlap:
            log.info("trimtab: model= has no effect in summation mode (step needs every gradient)")
        if model is not None and self._overlap:
            self._hooks.extend(self._hook_forward(model))
        self._ctx.optimizers.append(self)

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
            wire_dtype(p.dtype)
            out.append((name, p, group_of[p]))
        missing = [p for p in group_of if p not in seen]
        if missing:
            raise ConfigError(
                f"{len(missing)} optimized parameters are not in named_parameters; pass "
                "model.named_parameters() for the model the optimizer was built on"
            )
        return out

    def _declare(self) -> None:
        ctx = self._ctx
        specs = [TensorSpec(n, tuple(p.shape), wire_dtype(p.dtype), g) for n, p, g in self._params]
        opt = {
            "cls": type(self._inner).__name__,
            "mode": self._mode.value,
            "groups": [hyperparameters(g) for g in self.param_groups],
        }
        ctx.declare(specs, opt)
        self._chunks_of: dict[torch.Tensor, list[ChunkSpec]] = {p: [] for _, p, _ in self._params}
        self._group_of = {p: g for _, p, g in self._params}
        tensors = [p for _, p, _ in self._params]
        for c in ctx.chunks:
            self._chunks_of[tensors[c.tensor]].append(c)
        self._arena, self._slots = self._make_arena()
        self._local: dict[str, bool] = {}  # server address -> shares our arena
        self._reseed_servers(tensors, root_rank=0, force=True)

    def _make_arena(self) -> tuple[Arena | None, dict[int, tuple[int, int]]]:
        """This worker's shared memory for its servers on this machine (see ``_shm``): a
        slot per chunk too big to ride inside a header, of the chunk's bytes. Returns the
        arena (None if shared memory is off or ``/dev/shm`` lacks the room) and each
        chunk's (offset, capacity). Does not block."""
        slots: dict[int, tuple[int, int]] = {}
        if not shm_enabled():
            return None, slots
        total = 0
        for p, chunks in self._chunks_of.items():
            for c in chunks:
                nbytes = c.numel * p.element_size()
                if nbytes > INLINE_MAX:
                    slots[c.id] = (total, nbytes)
                    total += -(-nbytes // 64) * 64  # cache-line aligned
        if not slots:
            return None, slots
        try:
            arena = Arena.create(self._ctx.config.job, f"w{self._ctx.rank}", total)
        except (OSError, ValueError) as exc:
            log.info("trimtab: no shared memory for pushes (%s); using the sockets", exc)
            return None, {}
        return arena, slots

    def _release_arena(self) -> None:
        """Remove this worker's shared memory (the job is over for it). Idempotent."""
        if self._arena is not None:
            self._arena.close()
            self._arena = None
            self._slots = {}

    def _shares(self, address: str) -> bool:
        """Whether pushes to the server at ``address`` go through our shared memory."""
        local = self._local.get(address)
        if local is None:
            local = self._local[address] = self._arena is not None and is_local(address)
        return local

    def _hook_forward(self, model: torch.nn.Module) -> list[Any]:
        """Make each module's forward wait for its own parameters, and the model's
        ``state_dict()`` for all of them."""
        hooks = []
        for module in model.modules():
            own: list[torch.Tensor] = [
                p for p in module.parameters(recurse=False) if p in self._chunks_of
            ]
            if own:
                wait_own = functools.partial(self._before_forward, own)
                hooks.append(module.register_forward_pre_hook(wait_own))
        hooks.append(
            model.register_state_dict_pre_hook(  # type: ignore[no-untyped-call]
                lambda *_: self.wait_parameters()
            )
        )
        # Once the whole forward has run, what has not arrived yet (parameters whose
        # module's forward did not run, read outside forward: a penalty in the loss,
        # say) is waited for, so nothing older than the step is read after forward.
        hooks.append(model.register_forward_hook(lambda *_: self.wait_parameters()))
        return hooks

    def _before_forward(self, params: list[torch.Tensor], module: object, args: object) -> None:
        if self._arriving:
            self._arrive(params)

    def _reseed_servers(
        self, tensors: Iterable[torch.Tensor], root_rank: int, force: bool = False
    ) -> None:
        """Make the servers hold the root's values of those of ``tensors`` that are our
        parameters, and every worker adopt them. Collective; blocks."""
        ptrs = {t.data_ptr() for t in tensors}
        params = [p for p in self._chunks_of if force or p.data_ptr() in ptrs]
        if not params:
            return
        ctx = self._ctx
        if ctx.rank == root_rank:
            sent = []
            for p in params:
                for c in self._chunks_of[p]:
                    header = self._tensor_header(Data.INIT, c)
                    frames = [as_bytes(p.data.view(-1)[c.offset : c.offset + c.numel])]
                    fut = ctx.client.request(ctx.server_of(c.id), header, frames)
                    sent.append((fut, c, header, frames))
            for fut, c, header, frames in sent:
                self._await(fut, c, header, frames, None)
        ctx.barrier()
        if ctx.rank != root_rank:
            self._pull(params)

    @property
    def _epoch(self) -> int:
        return self._ctx.placement.epoch if self._ctx.placement else 0

    def _tensor_header(self, op: Data, c: ChunkSpec) -> dict[str, Any]:
        return {"o": int(op), "c": c.id, "e": self._epoch, "dt": c.dtype, "n": c.numel}

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
        if self._inflight:
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
        if p in self._arriving:  # not used in a hooked forward: its answer lands now
            self._arrive([p])
        if not self._inflight and not self._skipping:
            self._check_directive()
        if self._pending_report is not None and time.monotonic() >= self._next_report:
            # The previous step's timings leave with this step's first gradient, so the
            # coordinator hears from every worker when their gradients are ready (the
            # synchronisation point of BSP anyway), not later. Where the coordinator
            # needs no report per step, steps in between are not reported.
            self._report_future = self._report(*self._pending_report)
            self._pending_report = None
            self._next_report = time.monotonic() + float(self._ctx.job.get("report_s", 0.0))
        if self._skipping:
            return
        group = self._group_of[p]
        if group not in self._step_hp:
            hp = hyperparameters(self.param_groups[group])
            self._step_hp[group] = None if hp == self._sent_hp[group] else hp
            self._sent_hp[group] = hp
        hp_changed = self._step_hp[group]
        flat = None
        if grad is not None:
            if grad.is_sparse:
                raise UsageError("sparse gradients are not supported; use dense embeddings")
            flat = grad.detach().contiguous().view(-1)
            wire = self._compression.wire_dtype(flat.dtype)
            if wire != flat.dtype:
                # Narrowed into a buffer kept for this parameter: its previous push was
                # answered (in synchronize) before this one, so nothing still reads it.
                buf = self._wire.get(p)
                if buf is None:
                    buf = self._wire[p] = torch.empty(flat.numel(), dtype=wire)
                buf.copy_(flat)
                flat = buf
            elif flat.device.type != "cpu":
                flat = flat.cpu()
        futs = []
        sent = time.perf_counter()
        raw, size, dt = None, 0, ""
        if flat is not None:
            raw = as_bytes(flat)  # sliced per chunk below, without copying
            size, dt = flat.element_size(), wire_dtype(flat.dtype)
        for c in self._chunks_of[p]:
            header = self._tensor_header(Data.PUSH, c)
            header.update(
                r=self._ctx.rank, k=self._clock, w=self._batch_size, v=self._versions.get(c.id, 0)
            )
            if hp_changed is not None:
                header["hp"] = hp_changed
            nbytes = 0
            owner = self._ctx.owner_of(c.id, self._clock)
            address = self._ctx.address(owner)
            frames: list[memoryview] = []
            if raw is None:
                header["z"] = True
            else:
                header["dt"] = dt
                nbytes = c.numel * size
                data = raw[c.offset * size : c.offset * size + nbytes]
                slot = self._slots.get(c.id)
                if slot is not None and INLINE_MAX < nbytes <= slot[1] and self._shares(address):
                    assert self._arena is not None
                    # The chunk's previous reply was read before this push (see _shm).
                    self._arena.buf[slot[0] : slot[0] + nbytes] = data
                    header["sm"] = [self._arena.name, slot[0], slot[1]]
                else:
                    frames = inline(header, data)
            request = self._ctx.client.request(address, header, frames)
            futs.append((request, header, frames, owner, nbytes))
            if self._timed:
                traffic = self._traffic.get(owner)
                if traffic is None:
                    self._traffic[owner] = [sent, sent, nbytes]
                else:
                    traffic[2] += nbytes
        self._inflight[p] = futs

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
        for p in self._chunks_of:
            if p not in self._inflight:
                self._push(p, p.grad)
        if self._skipping:
            self._skip_ahead()
            return
        for p, futs in self._inflight.items():
            self._arriving[p] = (futs, self._clock)
        self._inflight.clear()
        self._counts.clear()
        self._step_hp.clear()

    def wait_parameters(self) -> None:
        """Block until every answer of the steps taken so far is written: the updated
        values in server mode (needed with ``model=`` before reading parameters outside
        forward), the mean gradients in summation mode.
        Raises :class:`~trimtab.JobAborted`, :class:`~trimtab.NodeTimeout`."""
        self._arrive(list(self._arriving))

    def _arrive(self, params: list[torch.Tensor]) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            for p in params:
                sent = self._arriving.pop(p, None)
                if sent is None:
                    continue
                futs, clock = sent
                for c, (f, header, frames, owner, pushed) in zip(
                    self._chunks_of[p], futs, strict=True
                ):
                    reply = self._await(f, c, header, frames, clock)
                    if reply.header.get("sm"):
                        reply = self._shared_reply(c, reply)
                    traffic = self._traffic.get(owner) if self._timed else None
                    if traffic is not None and f.exception() is None:
                        # Answered by the server it was sent to (not resent after a
                        # move): the last reply read off the socket closes its span.
                        traffic[1] = max(traffic[1], reply.at)
                        traffic[2] += reply.frames[0].nbytes if reply.frames else 0
                    elif traffic is not None:
                        # Moved and resent: the server it was sent to only said so, so
                        # its bytes are not that server's work. Left in, they credited a
                        # server just relieved of chunks with all its old load over the
                        # span of the few it kept (a 20 MB/s server read 56).
                        traffic[2] -= pushed
                    if self._mode is OptimizerMode.SERVER:
                        self._write_value(p, c, reply)
                    elif not reply.header.get("z"):
                        if p.grad is None:
                            p.grad = torch.zeros_like(p)
                        self._write(p.grad, c, reply)
        self._arrive_s += time.perf_counter() - started

    def _await(
        self,
        fut: concurrent.futures.Future[Reply],
        c: ChunkSpec,
        header: dict[str, Any],
        frames: list[Any],
        clock: int | None,
    ) -> Reply:
        """Wait for a chunk request's reply; if the chunk moved, fetch the new map and
        send the request again to the new owner. Blocks; raises as :func:`wait`, and
        :class:`RemoteError` if the chunk keeps moving."""
        ctx = self._ctx
        for _ in range(_MAX_MOVES):
            try:
                self._awaited = (c.id, header["i"], clock)
                return wait(fut, ctx.timeout_s)
            except ChunkMoved as moved:
                ctx.refresh_map(moved.epoch)
                header["e"] = self._epoch
                fut = ctx.client.request(ctx.server_of(c.id, clock), header, frames)
            except RemoteError as exc:
                if exc.code != ErrorCode.NO_SHM.value or "sm" not in header:
                    raise
                # That server cannot map our shared memory: it gets the bytes, from now on.
                address = ctx.server_of(c.id, clock)
                log.info("trimtab: %s: %s", address, exc)
                self._local[address] = False
                _, offset, _ = header.pop("sm")
                assert self._arena is not None
                nbytes = c.numel * DTYPE_SIZES[header["dt"]]
                frames = [self._arena.view(offset, nbytes)]
                fut = ctx.client.request(address, header, frames)
        raise RemoteError(
            "moved", f"chunk {c.id} moved {_MAX_MOVES} times during one request; giving up"
        )

    def describe(self) -> str:
        """Where this optimizer stands, for a hung job's dump (:data:`STACK_SIGNAL`): its
        clock and the chunk requests not yet answered. Only reads; never blocks."""
        unanswered = [
            f"chunk {header['c']} (clock {clock}, request {header.get('i')}) sent to server "
            f"{owner}" + (f" [{type(f.exception()).__name__}]" if f.done() else "")
            for futs, clock in self._arriving.values()
            for f, header, _, owner, _ in futs
            if not f.done() or f.exception() is not None
        ]
        lines = [
            f"  optimizer: clock {self._clock}, {len(self._inflight)} tensors pushed this step, "
            f"{len(self._arriving)} awaiting values"
        ]
        if self._awaited is not None:
            cid, rid, clock = self._awaited
            where = self._ctx.server_of(cid, clock) if self._ctx.placement else "?"
            lines.append(f"  last waited for: chunk {cid}, request {rid}, at {where}")
        lines.extend(f"  unanswered: {u}" for u in unanswered[:20])
        if len(unanswered) > 20:
            lines.append(f"  ... and {len(unanswered) - 20} more")
        return "\n".join(lines)

    def _shared_reply(self, c: ChunkSpec, reply: Reply) -> Reply:
        """A reply whose value the server wrote into chunk ``c``'s slot of our shared
        memory, with that value as its frame. Raises :class:`RemoteError` if the server
        says so of a chunk that has no slot, or of a value that would not fit it."""
        slot = self._slots.get(c.id)
        h = reply.header
        nbytes = int(h.get("n", 0)) * DTYPE_SIZES.get(str(h.get("dt")), 0)
        if self._arena is None or slot is None or not 0 < nbytes <= slot[1]:
            raise RemoteError(
                ErrorCode.MALFORMED.value, f"chunk {c.id}: a shared-memory reply with no slot"
            )
        return reply._replace(frames=[self._arena.view(slot[0], nbytes)])

    def _write(self, dst: torch.Tensor, c: ChunkSpec, reply: Reply) -> None:
        h = reply.header
        self._versions[c.id] = h["v"]
        src = tensor_from(reply.frames[0], h["dt"], h["n"])
        dst.view(-1)[c.offset : c.offset + c.numel].copy_(src)

    def _write_value(self, p: torch.Tensor, c: ChunkSpec, reply: Reply) -> None:
        """Write a chunk's new value into parameter ``p``: small chunks of a CPU
        parameter as bytes, the others as :meth:`_write` does."""
        frame = reply.frames[0] if reply.frames else None
        item = p.element_size()
        size = c.numel * item
        view = None
        if (
            frame is not None
            and size <= _BYTE_WRITE_MAX
            and frame.nbytes == size
            and reply.header.get("dt") == c.dtype
        ):
            view = self._byte_view(p)
        if view is None or frame is None:
            self._write(p.data, c, reply)
            return
        self._versions[c.id] = reply.header["v"]
        view[c.offset * item : c.offset * item + size] = frame

    def _byte_view(self, p: torch.Tensor) -> memoryview | None:
        """A byte view of ``p``'s memory, kept while ``p.data`` stays the same; None for
        a parameter not on the CPU or not contiguous."""
        if p.device.type != "cpu":
            return None
        ptr = p.data_ptr()
        cached = self._bytes_of.get(p)
        if cached is None or cached[0] != ptr:  # first write, or p.data was replaced
            if not p.is_contiguous():
                return None
            cached = self._bytes_of[p] = (ptr, as_bytes(p.data))
        return cached[1]

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within this block, :meth:`step` does not synchronize (you already did)."""
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def _check_directive(self) -> None:
        """At a step's first push: did the coordinator tell us to refresh (SaPS)?"""
        d = self._directive
        if d is not None and d.done() and d.exception() is None:
            header = d.result().header
            self._ctx.refresh_map(int(header.get("epoch", 0)))
            if header.get("refresh"):
                self._skipping = True
                self._lead = int(header.get("lead", self._clock))
            self._directive = None

    def refresh(self) -> None:
        """Replace the parameters with the servers' current values (server mode). Blocks.

        Useful in asynchronous modes, e.g. before evaluating at the end of training."""
        if self._inflight:
            raise UsageError("refresh() between backward and step(); call step() first")
        self.wait_parameters()
        if self._mode is OptimizerMode.SUMMATION:
            raise UsageError(
                "refresh() needs server mode: in summation mode the workers, "
                "not the servers, hold the parameters"
            )
        self._pull(list(self._chunks_of))

    def _pull(self, params: list[torch.Tensor]) -> None:
        ctx = self._ctx
        pulls = []
        for p in params:
            for c in self._chunks_of[p]:
                header: dict[str, Any] = {"o": int(Data.PULL), "c": c.id, "e": self._epoch}
                pulls.append((p, c, header, ctx.client.request(ctx.server_of(c.id), header)))
        with torch.no_grad():
            for p, c, header, f in pulls:
                self._write(p.data, c, self._await(f, c, header, [], None))

    def _skip_ahead(self) -> None:
        """Drop this step's (stale) gradients, fetch current values, jump the clock."""
        ctx = self._ctx
        self._inflight.clear()
        if self._mode is OptimizerMode.SERVER:
            self.refresh()
        log.info(
            "worker %d lagged: skipped its stale gradient, clock %d -> %d",
            ctx.rank,
            self._clock,
            max(self._clock, self._lead - 1),
        )
        self.skipped += 1
        self._clock = max(self._clock, self._lead - 1)
        self._skipping = False
        self._inflight.clear()
        self._counts.clear()
        self._step_hp.clear()
        self._synchronized = True

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Finish the step: synchronize (unless done; with ``model=``, only send), apply
        the update, report the step's timings to the coordinator (and, under LB-BSP,
        learn every worker's next batch size), advance the clock. Blocks; raises as
        :meth:`synchronize`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # With model=, forward's waits for this step's values were communication.
        forward_waits = self._arrive_s
        compute = time.perf_counter() - self._step_started - forward_waits
        cpu = (time.process_time() - self._cpu_started) / max(compute, 1e-9)
        straggler = self._ctx.straggler
        if straggler:
            straggler.on_step(self._clock)
            factor = straggler.factor(self._clock)
            if factor > 1.0:  # emulated slowness: real compute plus a proportional sleep
                time.sleep((factor - 1.0) * compute)
                compute *= factor
        waited = time.perf_counter()
        if not self._synchronized and not self._skip_sync:
            if self._overlap:
                self._send_rest()  # the next forward waits, module by module
            else:
                self.synchronize()
        elif not self._synchronized:
            raise UsageError("skip_synchronize() without synchronize() first")
        comm = time.perf_counter() - waited + forward_waits
        self._arrive_s = 0.0
        if self._mode is OptimizerMode.SUMMATION:
            self._inner.step()
        self._synchronized = False
        self.last_compute_s, self.last_comm_s = compute, comm
        self._pending_report = (
            self._clock,
            int(self._batch_size),
            compute,
            comm,
            cpu,
            self._spans_of_step(waited),
        )
        report, self._report_future = self._report_future, None
        if report is not None:
            # LB-BSP: the sizes for the next step, from every worker's previous-step
            # timings (the policy is one step behind, as the paper's semi-dynamic scheme).
            header = wait(report, self._ctx.timeout_s).header
            self._ctx.refresh_map(int(header.get("epoch", 0)))
            sizes = header["sizes"]
            self.batch_sizes = list(sizes)
            self._batch_size = float(sizes[self._ctx.rank])
        self._clock += 1
        self._step_started = time.perf_counter()
        self._cpu_started = time.process_time()
        return loss

    def _spans_of_step(self, waited: float) -> list[list[float]]:
        """Per server this step pushed to: ``[server, seconds from the first push sent to
        the last reply read, seconds from the later of that push and the start of the
        wait (``waited``) to that reply, bytes both ways]``; and start the next step's
        count. A reply is timed when it is read, and replies are read only while this
        thread waits: pushes sent during backward make the first span hold compute too
        (so the bytes over it are a lower bound of the server's speed), the second
        leaves out what the server did during backward (an upper bound, roughly).
        Empty unless the job places live (psld) and without ``model=``.
        """
        traffic, self._traffic = self._traffic, {}
        return [
            [s, last - first, last - max(first, waited), n]
            for s, (first, last, n) in traffic.items()
            if last > first
        ]

    def _report(
        self,
        clock: int,
        batch: int,
        compute: float,
        comm: float,
        cpu: float,
        spans: list[list[float]],
    ) -> concurrent.futures.Future[Reply] | None:
        """Send step ``clock``'s measurements; return the future to wait on under LB-BSP."""
        header: dict[str, Any] = {
            "o": int(Control.REPORT),
            "k": clock,
            "b": batch,
            "cs": compute,
            "ms": comm,
            "cpu": min(cpu, 1.0),
            "lo": self._ctx.routing_floor(),
        }
        if spans:
            header["sv"] = spans
        fut = self._ctx.client.control(header)
        if self._ctx.job.get("batching", "equal") == "equal":
            self._directive = fut  # read at the next step's first push, never waited for
            return None
        return fut

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear gradients. Raises :class:`UsageError` between backward and step."""
        if self._inflight:
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
        state["trimtab"] = {"clock": self._clock, "epoch": self._epoch}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the inner optimizer's state. trimtab's clock is not rewound: the
        servers' rounds continue from where this job is."""
        state = dict(state_dict)
        state.pop("trimtab", None)
        self._inner.load_state_dict(state)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r}, mode={self._mode.value})"
