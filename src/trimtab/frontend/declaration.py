"""How a :class:`~trimtab.frontend.optimizer.DistributedOptimizer` becomes a table of
the job: its tensors declared, the chunks the job cut them into, the pusher over those
chunks, and the servers seeded with the root's values (or, for a table the job has
already, the servers' values taken)."""

from __future__ import annotations

import torch

from trimtab.core.chunks import ChunkSpec, TensorSpec
from trimtab.errors import ConfigError
from trimtab.frontend.compression import compressor
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.state import scatter
from trimtab.frontend.tables import eager_state, is_table, link
from trimtab.protocol import headers
from trimtab.protocol.messages import INLINE_MAX
from trimtab.roles.server.optim import ON_SERVERS, OptimizerMode, hyperparameters
from trimtab.roles.worker.context import Context, Table
from trimtab.runtime.tensors import wire_dtype
from trimtab.transport.shm import SlotMap


def declare_table(
    ctx: Context,
    inner: torch.optim.Optimizer,
    params: list[tuple[str, torch.Tensor, int]],
    *,
    mode: OptimizerMode,
    compression: object,
    op: str,
    predivide: float,
    overlap: bool,
) -> tuple[Pusher, Table]:
    """Declare ``params`` (name, tensor, param group) of the user's optimizer ``inner``
    (blocks until every worker did), make the pusher over the chunks the job cut them
    into, and seed the servers with the root's values (and the root's optimizer state,
    if ``inner`` holds some: a checkpoint loaded before wrapping it). For a table the
    job has already (built again after ``init()`` following ``shutdown()``), take the
    servers' values instead (server mode; in summation mode the workers hold the model,
    and this one still has it). Collective; blocks. Raises what
    :meth:`Context.declare` raises."""
    specs = [TensorSpec(n, tuple(p.shape), wire_dtype(p.dtype), g) for n, p, g in params]
    if mode is not OptimizerMode.SERVER and any(is_table(p) for _, p, _ in params):
        raise ConfigError(
            "a table that lives on the servers (trimtab.nn.Embedding) needs server mode: "
            f"an optimizer the servers run ({', '.join(sorted(ON_SERVERS))}), mode='auto'"
        )
    opt = {
        "cls": type(inner).__name__,
        "mode": mode.value,
        "groups": [hyperparameters(g) for g in inner.param_groups],
        "op": op,
        "post": predivide,
    }
    table = ctx.declare(specs, opt)  # this optimizer's chunks, among the job's
    tensors = [p for _, p, _ in params]
    chunks_of: dict[torch.Tensor, list[ChunkSpec]] = dict(
        zip(tensors, table.chunks_by_tensor(), strict=True)
    )
    slots = SlotMap.create(
        ctx.config.job,
        f"w{ctx.rank}",
        (
            (c.id, c.numel * p.element_size())
            for p, cs in chunks_of.items()
            if not is_table(p)  # (rows travel inline: no slot the table's size)
            for c in cs
        ),
        min_bytes=INLINE_MAX,
        enabled=ctx.config.shared_memory,
    )
    pusher = Pusher(
        ctx,
        chunks_of,
        compressor(ctx.compression if compression is None else compression),
        summation=mode is OptimizerMode.SUMMATION,
        slots=slots,
        # Per-server timings (psld's, the run record's), not with model=: there replies are
        # read when forward needs them, so when they were read says when compute asked.
        timed=ctx.job.time_servers and not overlap,
        prescale=predivide,
    )
    for p in tensors:
        if is_table(p):
            link(p, pusher)
    if table.clock is not None:
        if mode is OptimizerMode.SERVER:
            pusher.pull(tensors)
        return pusher, table
    if mode is OptimizerMode.SERVER:
        # The root's state goes to the servers before seed's barrier.
        if ctx.rank == 0 and any(inner.state.values()):  # (a table's start stays out)
            eager = {id(p): p for p, s in inner.state.items() if eager_state(p, s)}
            rest = {p: s for p, s in inner.state.items() if id(p) not in eager}
            scatter(pusher, rest, skip=eager.values())
        inner.state.clear()
    pusher.seed(tensors, root_rank=headers.SEED_ROOT)
    return pusher, table
