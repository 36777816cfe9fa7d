"""Worker script of ``trimtab experiment sparse``: one training run on the synthetic CTR
data set (:mod:`.ctr`), as a trimtab worker (``--mode trimtab``: the tables on the
servers, ``--hot N`` rows of each replicated here), a torch DDP worker over gloo with
sparse gradients (``--mode ddp``: every worker holds the whole tables), or one process
over the global batches (``--mode one``). Prints one result line (``RESULT`` + JSON):
samples per second over the timed steps, held-out log loss and AUC (rank 0), peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from typing import Any

import torch
from torch import nn

from trimtab_tools.experiments.ctr import CTR, DLRM, auc, log_loss

RESULT = "SPARSE-RESULT "
HELD_OUT = 4096


def _table_start(rows: int, dim: int, t: int) -> torch.Tensor:
    """Table ``t``'s start: trimtab.nn's with ``seed=t``, so every run starts alike."""
    from trimtab.frontend.tables import TableInit, init_values

    start = init_values((rows, dim), TableInit(seed=t), 0, rows * dim, torch.float32)
    return start.view(rows, dim)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("trimtab", "ddp", "one"), required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--bag", type=int, default=4)
    parser.add_argument("--s", type=float, default=1.1)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch", type=int, default=512, help="global batch")
    parser.add_argument("--hot", type=int, default=0)
    parser.add_argument(
        "--no-prefetch", action="store_true", help="trimtab: no table.prefetch of the next batch"
    )
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--addr", default="127.0.0.1", help="DDP's rank 0 address")
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = CTR(args.rows, tables=args.tables, bag=args.bag, s=args.s)
    rank, world = args.rank, args.world
    if args.mode == "trimtab":
        import trimtab
        import trimtab.nn

        trimtab.init()
        rank, world = trimtab.rank(), trimtab.size()

        def table(t: int) -> nn.Module:
            return trimtab.nn.EmbeddingBag(
                args.rows, args.dim, mode="mean", seed=t, hot_rows=args.hot, hot_refresh=10
            )
    else:

        def table(t: int) -> nn.Module:
            return nn.EmbeddingBag(
                args.rows,
                args.dim,
                mode="mean",
                sparse=True,
                _weight=_table_start(args.rows, args.dim, t),
            )

    model: Any = DLRM(data, args.dim, table, seed=0)
    emb = [p for n, p in model.named_parameters() if n.startswith("tables")]
    dense = [p for n, p in model.named_parameters() if n.startswith("mlp")]
    inner = [torch.optim.Adagrad(emb, lr=0.05), torch.optim.Adagrad(dense, lr=0.05)]
    if args.mode == "trimtab":
        import trimtab

        named = list(model.named_parameters())
        opts: list[Any] = [
            trimtab.DistributedOptimizer(inner[0], [x for x in named if x[0].startswith("tables")]),
            trimtab.DistributedOptimizer(inner[1], [x for x in named if x[0].startswith("mlp")]),
        ]
        net = model
    elif args.mode == "ddp":
        import torch.distributed as dist

        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group(
            "gloo", init_method=f"tcp://{args.addr}:{args.port}", rank=rank, world_size=world
        )
        net = nn.parallel.DistributedDataParallel(model)
        opts = inner
    else:
        net, opts = model, inner
    share = args.batch // world
    lo, hi = rank * share, (rank + 1) * share
    started = 0.0
    # A trimtab table's data loader announces the next batch's ids once step() returned
    # (table.prefetch, docs/sparse.md 2): their reads overlap what precedes the forward,
    # the tables' reads go out together instead of table by table.
    prefetch = args.mode == "trimtab" and not args.no_prefetch
    batch = data.batch(0, args.batch)
    for step in range(args.steps):
        if step == args.warmup:
            started = time.perf_counter()
        ids, x, y = batch
        for o in opts:
            o.zero_grad()
        out = net([i[lo:hi] for i in ids], x[lo:hi])
        loss: torch.Tensor = nn.functional.binary_cross_entropy_with_logits(out, y[lo:hi])
        loss.backward()  # type: ignore[no-untyped-call]
        for o in opts:
            o.step()
        batch = data.batch(step + 1, args.batch)
        if prefetch and step + 1 < args.steps:
            last = len(model.tables) - 1  # (the tables' reads in one message a server)
            for k, (tab, i) in enumerate(zip(model.tables, batch[0], strict=True)):
                tab.prefetch(i[lo:hi], hold=k < last)
    elapsed = time.perf_counter() - started
    samples = (args.steps - args.warmup) * args.batch
    result: dict[str, Any] = {
        "mode": args.mode,
        "rank": rank,
        "samples_per_s": samples / elapsed,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "dense_bytes": sum(p.numel() * p.element_size() for p in dense),
    }
    if rank == 0:
        ids, x, y = data.batch(-1, HELD_OUT)
        with torch.no_grad():
            logits = model(ids, x)
        result.update(log_loss=log_loss(logits, y), auc=auc(logits, y))
        if args.mode == "trimtab":
            reports = [t.hot_report() for t in model.tables]
            result["hot"] = {
                "rows": sum(r["hot_rows"] for r in reports),
                "hit_rate": sum(r["hits"] for r in reports)
                / max(sum(r["reads"] for r in reports), 1),
                "max_age": max(r["max_age"] for r in reports),
            }
    print(RESULT + json.dumps(result), flush=True)
    if args.mode == "trimtab":
        import trimtab

        trimtab.shutdown()
    elif args.mode == "ddp":
        import torch.distributed as dist

        dist.destroy_process_group()
        # Its result is out: leave without the interpreter's exit, where a DDP worker hung
        # once in about 25 runs (gloo's threads), leaving the experiment waiting 30 min.
        os._exit(0)


if __name__ == "__main__":
    main()
