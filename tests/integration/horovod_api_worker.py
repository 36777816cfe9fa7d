"""A Horovod-style script for test_horovod_api.py: ``import trimtab as hvd`` and every
module-level call Horovod's PyTorch API has, with rank-dependent inputs. Each worker
writes what it got to ``OUT/rank{r}.json``; the test compares with Horovod's documented
results. Run under ``trimtab run --workers N --servers 1 -- python THIS OUT``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

import trimtab as hvd

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max}


def values(t: torch.Tensor) -> Any:
    return t.double().tolist() if t.dtype is not torch.bool else t.tolist()


def error(call: Any) -> dict[str, str]:
    """The class and code of what ``call()`` raised (or nothing)."""
    try:
        call()
    except hvd.TrimtabError as exc:
        return {"type": type(exc).__name__, "code": getattr(exc, "code", ""), "msg": str(exc)}
    return {}


def main() -> None:
    out = Path(sys.argv[1])
    hvd.init()
    hvd.init()  # a second init() changes nothing
    r, n = hvd.rank(), hvd.size()
    got: dict[str, Any] = {
        "rank": r,
        "size": n,
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
        "is_initialized": hvd.is_initialized(),
        "built": {
            f.__name__: f()
            for f in (
                hvd.mpi_built,
                hvd.gloo_built,
                hvd.nccl_built,
                hvd.ddl_built,
                hvd.ccl_built,
                hvd.cuda_built,
                hvd.rocm_built,
                hvd.mpi_threads_supported,
                hvd.mpi_enabled,
                hvd.gloo_enabled,
            )
        },
    }

    # Every op on every dtype: a 2x3 tensor of rank + 1.
    reduced: dict[str, dict[str, Any]] = {}
    for dname, dtype in DTYPES.items():
        for oname, op in {**OPS, "Product": hvd.Product}.items():
            t = torch.full((2, 3), r + 1, dtype=dtype)
            res = hvd.allreduce(t, op=op)
            reduced[f"{dname}/{oname}"] = {
                "dtype": str(res.dtype).removeprefix("torch."),
                "shape": list(res.shape),
                "values": values(res),
                "input_kept": values(t) == values(torch.full((2, 3), r + 1, dtype=dtype)),
            }
    got["reduced"] = reduced

    one = torch.tensor([float(r + 1)])
    got["default_op"] = hvd.allreduce(one).item()
    got["average_true"] = hvd.allreduce(one, average=True).item()
    got["average_false"] = hvd.allreduce(one, average=False).item()
    got["scalar"] = {"shape": list(hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum).shape)}
    # prescale differs per rank (applied by each worker to its own tensor), postscale 3.
    got["scaled"] = hvd.allreduce(
        one, op=hvd.Sum, prescale_factor=float(r + 1), postscale_factor=3.0
    ).item()
    got["scaled_int"] = hvd.allreduce(
        torch.tensor([10 * (r + 1)], dtype=torch.int32), op=hvd.Sum, postscale_factor=0.5
    ).tolist()
    inplace = torch.tensor([float(r + 1), 2.0 * (r + 1)])
    returned = hvd.allreduce_(inplace, op=hvd.Sum)
    got["inplace"] = {"values": inplace.tolist(), "same_object": returned is inplace}

    # Named async collectives, submitted in a different order on each rank.
    a = torch.tensor([float(r + 1)])
    b = torch.tensor([10.0 * (r + 1)])
    order = ["a", "b"] if r % 2 == 0 else ["b", "a"]
    handles: dict[str, Any] = {}
    for key in order:
        if key == "a":
            handles[key] = hvd.allreduce_async(a, name="a", op=hvd.Sum)
        else:
            handles[key] = hvd.allreduce_async_(b, name="b", op=hvd.Max)
    polled = [hvd.poll(h) for h in handles.values()]
    ra = hvd.synchronize(handles["a"])
    rb = hvd.synchronize(handles["b"])
    got["async"] = {
        "a": ra.tolist(),
        "b": rb.tolist(),
        "b_in_place": b.tolist(),
        "a_input_kept": a.tolist(),
        "polled_are_bools": all(isinstance(p, bool) for p in polled),
        "poll_after": hvd.poll(handles["a"]),
    }

    # allgather: rank r gives r + 1 rows of [r, r].
    g = hvd.allgather(torch.full((r + 1, 2), r, dtype=torch.int64))
    gb = hvd.synchronize(hvd.allgather_async(torch.tensor([r % 2 == 0] * (r + 1))))
    got["allgather"] = {"shape": list(g.shape), "values": g.tolist(), "dtype": str(g.dtype)}
    got["allgather_bool"] = gb.tolist()
    got["allgather_bf16"] = values(hvd.allgather(torch.full((1, 2), r + 0.5, dtype=torch.bfloat16)))

    # broadcast from root 1.
    src = torch.full((3,), float(r))
    got["broadcast"] = hvd.broadcast(src, root_rank=1).tolist()
    got["broadcast_input_kept"] = src.tolist()
    dst = torch.full((2,), r, dtype=torch.int32)
    hvd.broadcast_(dst, 1)
    got["broadcast_"] = dst.tolist()
    got["broadcast_async"] = hvd.synchronize(
        hvd.broadcast_async(torch.tensor([r + 0.25], dtype=torch.float16), 1)
    ).tolist()

    # Objects.
    got["allgather_object"] = hvd.allgather_object({"rank": r, "s": "x" * r})
    got["broadcast_object"] = hvd.broadcast_object(
        {"from": r, "list": list(range(r + 1))} if r == 1 else None, root_rank=1
    )

    # Compression: Horovod's compressor interface, and allreduce through it.
    c, ctx = hvd.Compression.fp16.compress(torch.tensor([1.5, 2.5]))
    back = hvd.Compression.fp16.decompress(c, ctx)
    got["compression"] = {
        "compressed": str(c.dtype),
        "back": str(back.dtype),
        "none_same": hvd.Compression.none.compress(one)[0] is one,
        "allreduce_fp16": values(
            hvd.allreduce(torch.tensor([r + 1.0]), op=hvd.Sum, compression=hvd.Compression.fp16)
        ),
        "allreduce_fp16_dtype": str(
            hvd.allreduce(torch.tensor([1.0]), compression=hvd.Compression.fp16).dtype
        ),
    }

    # Mismatches: a clear RemoteError on every rank, and the job goes on.
    got["mismatch_shape"] = error(lambda: hvd.allreduce(torch.zeros(r + 1)))
    got["mismatch_dtype"] = error(
        lambda: hvd.allreduce(torch.zeros(2, dtype=torch.float32 if r else torch.float64))
    )
    got["mismatch_op"] = error(lambda: hvd.allreduce(one, name="op", op=hvd.Sum if r else hvd.Max))
    got["mismatch_kind"] = error(
        lambda: hvd.allreduce(one) if r == 0 else hvd.broadcast(one, root_rank=0)
    )
    got["after_mismatch"] = hvd.allreduce(one, op=hvd.Sum).item()

    # Refused at once, on this worker alone.
    got["adasum"] = error(lambda: hvd.allreduce(one, op=hvd.Adasum))
    got["bool_allreduce"] = error(lambda: hvd.allreduce(torch.tensor([True])))
    got["process_set"] = error(lambda: hvd.allreduce(one, process_set=object()))
    got["bad_root"] = error(lambda: hvd.broadcast(one, root_rank=n))
    got["both_average_and_op"] = error(lambda: hvd.allreduce(one, average=True, op=hvd.Sum))

    got["join"] = hvd.join()
    hvd.barrier()

    # Rank 0 leaves first, joins again (Horovod allows init() after shutdown()) and ends
    # its process: the others' next collective, which it never calls, is then refused,
    # not left hanging.
    if r == 0:
        hvd.shutdown()
        got["is_initialized_after_shutdown"] = hvd.is_initialized()
        got["init_after_shutdown"] = error(hvd.init)
        got["rank_after_init"] = hvd.rank()
        hvd.shutdown()
    else:
        got["after_rank0_left"] = error(lambda: hvd.allreduce(one))
    (out / f"rank{r}.json").write_text(json.dumps(got))
    hvd.shutdown()


if __name__ == "__main__":
    main()
