"""A DistributedOptimizer's state in server mode, and broadcasting a state dict.

In server mode each chunk's optimizer state (momentum, Adam's moments, the step count)
lives on the chunk's server, as the state of the user's own torch optimizer class run
over that chunk (:mod:`trimtab.roles.server.optim`). :func:`gather` asks every chunk's
server for it (STATE_GET) and puts each parameter's chunks back together, in exactly
the layout the user's optimizer keeps: per-element tensors in the parameter's shape,
scalars (``step``) as torch keeps them. :func:`scatter` cuts a parameter's state into
its chunks and sends them (STATE_SET). :func:`broadcast_object` carries any picklable
state dict (tuples, bools, None, tensors) from one worker to all.
"""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from trimtab.errors import RemoteError
from trimtab.frontend.pusher import Pusher
from trimtab.frontend.requests import ChunkRequest
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode
from trimtab.roles.server.optim import hyperparameters
from trimtab.roles.server.state import decode_tensors
from trimtab.roles.worker.context import Context
from trimtab.runtime.tensors import WIRE_DTYPES, as_bytes

#: A parameter's optimizer state, as torch keeps it: key -> tensor (or plain value).
ParamState = dict[str, Any]


def gather(pusher: Pusher, params: Iterable[torch.Tensor]) -> dict[torch.Tensor, ParamState]:
    """Each of ``params``' optimizer state, from its chunks' servers (no entry for a
    parameter with none yet). Call between steps (every answer written). Blocks; raises
    as :meth:`Pusher.ask`, and :class:`RemoteError` if a parameter's chunks disagree."""
    params = [p for p in params if pusher.chunks_of.get(p)]
    requests: list[tuple[Any, ChunkRequest, list[Any]]] = [
        (c, headers.state_get(chunk=c.id, epoch=pusher.epoch), [])
        for p in params
        for c in pusher.chunks_of[p]
    ]
    replies = iter(pusher.ask(requests))
    out: dict[torch.Tensor, ParamState] = {}
    for p in params:
        pieces = []
        for c in pusher.chunks_of[p]:
            reply = next(replies)
            msg = headers.read_state(reply.header)
            pieces.append(decode_tensors(msg["st"], reply.frames, c.numel))
        state = _join(p, pieces)
        if state:
            out[p] = state
    return out


def _join(p: torch.Tensor, pieces: list[ParamState]) -> ParamState:
    """One parameter's state from its chunks' (in order): per-element tensors (1-D, one
    element per element of the chunk) concatenated into ``p``'s shape, on its device;
    scalars taken from the first chunk (the same on all: they step together)."""
    keys = set(pieces[0])
    if any(set(piece) != keys for piece in pieces):
        raise RemoteError(
            ErrorCode.BAD_STATE.value,
            f"the chunks of a parameter of shape {tuple(p.shape)} hold different state keys: "
            f"{[sorted(piece) for piece in pieces]}",
        )
    state: ParamState = {}
    for key, first in pieces[0].items():
        if isinstance(first, torch.Tensor) and first.dim() == 1:
            joined = torch.cat([piece[key] for piece in pieces]) if len(pieces) > 1 else first
            state[key] = joined.view(p.shape).to(p.device)
        else:
            state[key] = first
    return state


def scatter(
    pusher: Pusher,
    states: Mapping[torch.Tensor, ParamState],
    hp_of: Mapping[torch.Tensor, Mapping[str, Any]] | None = None,
    *,
    values: bool = False,
    skip: Iterable[torch.Tensor] = (),
) -> None:
    """Make every chunk's server hold its part of ``states`` (a parameter missing from
    it: no state), with its group's hyperparameters ``hp_of[p]`` where given, and with
    ``values``, the parameter's current value too; the chunks of ``skip``'s parameters
    are left as they are. Blocks until every server acknowledged; raises as
    :meth:`Pusher.ask`."""
    requests: list[tuple[Any, ChunkRequest, list[Any]]] = []
    keep: list[torch.Tensor] = []  # the tensors the frames view, alive until sent
    skipped = {id(p) for p in skip}
    for p, chunks in pusher.chunks_of.items():
        if id(p) in skipped:
            continue
        state = states.get(p, {})
        flat: dict[str, torch.Tensor] = {}
        for key, v in state.items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                t = v.detach()
                if t.is_floating_point():  # as torch's load_state_dict casts it
                    t = t.to(p.dtype)
                flat[key] = t.reshape(-1).cpu().contiguous()
                keep.append(flat[key])
            elif isinstance(v, torch.Tensor):
                flat[key] = v.detach().cpu().contiguous().view(())
                keep.append(flat[key])
        data = p.detach().reshape(-1).cpu().contiguous() if values else None
        if data is not None:
            keep.append(data)
        hp = None if hp_of is None else hyperparameters(hp_of[p])
        for c in chunks:
            meta: headers.StateMeta = {}
            frames: list[Any] = []
            if data is not None:
                frames.append(as_bytes(data[c.offset : c.offset + c.numel]))
            for key, v in state.items():
                f = flat.get(key)
                if f is None:
                    meta[key] = ["v", v]
                elif f.dim() == 0:
                    meta[key] = ["t", WIRE_DTYPES[f.dtype], []]
                    frames.append(as_bytes(f.view(1)))
                else:
                    if f.numel() != p.numel():
                        raise ValueError(
                            f"state {key!r} has {f.numel()} elements, its parameter "
                            f"{p.numel()}: not this optimizer's state"
                        )
                    meta[key] = ["t", WIRE_DTYPES[f.dtype], [c.numel]]
                    frames.append(as_bytes(f[c.offset : c.offset + c.numel]))
            header = headers.state_set(
                chunk=c.id,
                epoch=pusher.epoch,
                state=meta,
                hp=hp,
                dtype=c.dtype if values else None,
                numel=c.numel,
            )
            requests.append((c, header, frames))
    pusher.ask(requests)
    del keep


def broadcast_object(ctx: Context, obj: Any, root_rank: int) -> Any:
    """Worker ``root_rank``'s ``obj`` (a state dict: tensors, numbers, bools, None,
    strings, tuples, lists, dicts), on every worker; tensors come back on the CPU.
    Collective (every worker calls it; ``obj`` is read on the root only). Blocks;
    raises as :meth:`Context.broadcast`."""
    size = torch.zeros(1, dtype=torch.int64)
    data = None
    if ctx.rank == root_rank:
        buf = io.BytesIO()
        torch.save(obj, buf)
        data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
        size[0] = data.numel()
    ctx.broadcast({"trimtab.object.size": size}, root_rank)
    if data is None:
        data = torch.empty(int(size[0]), dtype=torch.uint8)
    ctx.broadcast({"trimtab.object": data}, root_rank)
    if ctx.rank == root_rank:
        return obj
    return torch.load(io.BytesIO(data.numpy().tobytes()), map_location="cpu", weights_only=True)


def by_index(
    states: Mapping[torch.Tensor, ParamState], params: Sequence[torch.Tensor]
) -> dict[int, ParamState]:
    """``states`` keyed as torch's ``state_dict()`` keys them: by the parameter's place in
    ``params`` (every param group's, in order), in that order."""
    index = {p: i for i, p in enumerate(params)}
    return {index[p]: states[p] for p in sorted(states, key=index.__getitem__)}


def by_param(
    state_dict: Mapping[str, Any], params: Sequence[torch.Tensor]
) -> dict[torch.Tensor, ParamState]:
    """A torch ``state_dict()``'s ``state``, keyed by this optimizer's ``params`` (every
    param group's, in order), matched by place as torch's ``load_state_dict`` does."""
    saved = state_dict.get("state", {})
    ids = itertools.chain.from_iterable(g["params"] for g in state_dict["param_groups"])
    return {p: saved[i] for i, p in zip(ids, params, strict=True) if i in saved}


def zero_missing_grads(optimizer: torch.optim.Optimizer) -> None:
    """Give each trained parameter of ``optimizer`` that has no ``.grad`` a zero one, as
    Horovod's ``broadcast_optimizer_state`` leaves a fresh optimizer's parameters (it
    initialises the state by a step with zero gradients; trimtab takes no such step, so
    the state stays torch's fresh one). Never blocks."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def broadcast_state(
    ctx: Context, optimizer: torch.optim.Optimizer, root_rank: int, *, groups_only: bool
) -> None:
    """Load worker ``root_rank``'s ``optimizer.state_dict()`` into every worker's
    ``optimizer`` (``groups_only``: its param groups, the state left empty: a
    server-mode optimizer's lives on the servers). Collective; blocks; raises as
    :func:`broadcast_object` and torch's ``load_state_dict``."""
    mine = ctx.rank == root_rank
    state = optimizer.state_dict() if mine else None
    if state is not None and groups_only:
        state = {"state": {}, "param_groups": state["param_groups"]}
    state = broadcast_object(ctx, state, root_rank)
    if not mine:
        optimizer.load_state_dict(state)
