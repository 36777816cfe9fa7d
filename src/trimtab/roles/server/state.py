"""A chunk's optimizer state, read or replaced by a worker (STATE_GET, STATE_SET).

In server mode the optimizer state (momentum, Adam's moments, the step count) lives
with each chunk on its server. A worker reads it to save a checkpoint
(``DistributedOptimizer.state_dict()``) and replaces it to load one, or to hand the
servers an update it applied itself (the first step, see
:mod:`trimtab.frontend.optimizer`). The state travels as a HANDOVER carries it
(:func:`~trimtab.roles.server.handover.encode_state`). Nothing here sends or blocks: the
server's loop sends what these functions return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trimtab.core.dtypes import DTYPE_SIZES
from trimtab.errors import ProtocolError
from trimtab.protocol import headers
from trimtab.protocol.messages import ErrorCode, Header
from trimtab.roles.server.growing import PREFIX, take_grown
from trimtab.roles.server.handover import encode_state
from trimtab.roles.server.store import Chunk, ChunkStore
from trimtab.runtime.tensors import TORCH_DTYPES, check_tensor_frames, tensor_from
from trimtab.transport import Frame


def _server_mode(store: ChunkStore, cid: int) -> Chunk:
    chunk = store.owned(cid)
    if chunk.optimizer is None:
        raise ProtocolError(
            ErrorCode.BAD_STATE.value,
            f"chunk {cid}: the job runs in summation mode, where the optimizer state lives "
            "on the workers, not the servers",
        )
    return chunk


def state_reply(store: ChunkStore, header: Header) -> tuple[headers.StateHeader, list[Frame]]:
    """Answer a STATE_GET (``header`` as decoded): the chunk's hyperparameters and
    optimizer state, its tensors as frames. Raises MALFORMED for a mistyped key, as
    :meth:`ChunkStore.owned` (MOVED, UNKNOWN_CHUNK), BAD_STATE in summation mode."""
    msg = headers.read_state_get(header)
    chunk = _server_mode(store, msg["c"])
    assert chunk.optimizer is not None
    frames: list[Frame] = []
    hp, meta = encode_state(chunk.optimizer, frames, grown=False)
    reply = headers.state(
        rid=header["i"],
        chunk=chunk.spec.id,
        version=chunk.version,
        round=chunk.round,
        hp=hp,
        state=meta,
    )
    return reply, frames


def decode_tensors(
    meta: headers.StateMeta, frames: Sequence[memoryview], numel: int
) -> dict[str, Any]:
    """The state ``meta`` describes, its tensors copied out of ``frames`` (in order).
    Each tensor must be a scalar or hold ``numel`` elements (one per element of the
    chunk), of a wire dtype. Raises MALFORMED, BAD_DTYPE or BAD_SHAPE
    :class:`ProtocolError`; never blocks."""
    state: dict[str, Any] = {}
    rest = list(frames)
    for key, (kind, *info) in meta.items():
        if kind == "v":
            state[key] = info[0]
            continue
        dtype, shape = info
        if dtype not in DTYPE_SIZES:
            raise ProtocolError(ErrorCode.BAD_DTYPE.value, f"state {key!r}: no dtype {dtype!r}")
        if shape not in ([], [numel]) and not (key.startswith(PREFIX) and len(shape) == 1):
            raise ProtocolError(
                ErrorCode.BAD_SHAPE.value,
                f"state {key!r} has shape {shape}: a chunk's state is a scalar or {numel} elements",
            )
        n = shape[0] if shape else 1
        if not rest or rest[0].nbytes != n * DTYPE_SIZES[dtype]:
            raise ProtocolError(
                ErrorCode.BAD_SHAPE.value,
                f"state {key!r}: expected a frame of {n * DTYPE_SIZES[dtype]} bytes",
            )
        frame = rest.pop(0)
        t = tensor_from(frame, dtype, n) if n else torch.empty(0, dtype=TORCH_DTYPES[dtype])
        state[key] = t.clone().view(shape)
    if rest:
        raise ProtocolError(ErrorCode.MALFORMED.value, f"{len(rest)} frames more than 'st' says")
    return state


def load_state(store: ChunkStore, header: Header, frames: Sequence[memoryview]) -> None:
    """Take a STATE_SET (``header`` as decoded, ``frames``: those after the header):
    replace the chunk's optimizer state (and hyperparameters, and value, where given).
    Everything is checked before anything changes. Raises MALFORMED for a mistyped key,
    as :meth:`ChunkStore.owned`, BAD_STATE in summation mode, as :func:`decode_tensors`
    and ``check_tensor_frames`` for the value."""
    msg = headers.read_state_set(header)
    chunk = _server_mode(store, msg["c"])
    opt = chunk.optimizer
    assert opt is not None
    rest = list(frames)
    value = None
    if "dt" in msg:
        value = check_tensor_frames(header, rest[:1], chunk.spec.dtype, chunk.spec.numel)
        rest = rest[1:]
    state, grown = take_grown(decode_tensors(msg["st"], rest, chunk.spec.numel))
    if value is not None:
        chunk.value.copy_(value)
    if "hp" in msg:
        opt.set_hparams(msg["hp"])
    opt.optimizer.state.pop(opt.param, None)  # an empty st clears it (a fresh start)
    if grown is not None:  # (a worker's state holds none: the map stays as it is)
        opt.grown = grown
    if state:
        opt.optimizer.state[opt.param] = state
