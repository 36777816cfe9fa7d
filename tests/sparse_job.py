"""The training job of the sparse-gradient tests, and its one-process reference.

A Horovod-style script: an ``nn.EmbeddingBag(..., sparse=True)`` over skewed ids and a
dense MLP. Worker r of N trains on its slice of each global batch, with
``optimizer.batch_size`` its slice's size; the reference runs the same optimizers in one
process over the whole global batches. Under BSP the parameters must agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

STEPS = 12
GLOBAL_BATCH = 24
ROWS = 500
DIM = 6  # rows of 6 elements: chunks of 64 elements cut rows in two
#: The optimizers the job runs: "sgd", "adagrad" (one optimizer for everything),
#: "sparseadam" (SparseAdam for the table, Adam for the MLP: two optimizers).
OPTIMIZERS = ("sgd", "adagrad", "sparseadam")


#: The server table's starting values (trimtab.nn's tables start as this says).
TABLE_SEED = 5


class Model(nn.Module):
    """``server``: the table is a ``trimtab.nn.EmbeddingBag`` (on the servers), else
    torch's, starting from the same values (``reference``: the server table's)."""

    def __init__(
        self, seed: int, server: bool = False, reference: bool = False, hot: int = 0
    ) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mlp = nn.Sequential(nn.Linear(DIM + 4, 16), nn.Tanh(), nn.Linear(16, 3))
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        self.table: nn.Module
        if server:
            import trimtab.nn

            self.table = trimtab.nn.EmbeddingBag(
                ROWS, DIM, mode="mean", seed=TABLE_SEED, hot_rows=hot, hot_refresh=3
            )
        elif reference:
            self.table = nn.EmbeddingBag(
                ROWS, DIM, mode="mean", sparse=True, _weight=server_table_start()
            )
        else:
            self.table = nn.EmbeddingBag(ROWS, DIM, mode="mean", sparse=True)
            with torch.no_grad():
                self.table.weight.copy_(torch.randn(ROWS, DIM, generator=g) * 0.3)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.table(ids, offsets), x], dim=1))


def server_table_start() -> torch.Tensor:
    from trimtab.frontend.tables import TableInit, init_values

    start = init_values((ROWS, DIM), TableInit(seed=TABLE_SEED), 0, ROWS * DIM, torch.float32)
    return start.view(ROWS, DIM)


def optimizers(name: str, model: Model) -> list[tuple[torch.optim.Optimizer, list]]:
    """The job's optimizers, each with the named parameters it trains."""
    named = list(model.named_parameters())
    if name == "sgd":
        return [(torch.optim.SGD(model.parameters(), lr=0.2), named)]
    if name == "adagrad":
        return [(torch.optim.Adagrad(model.parameters(), lr=0.1, lr_decay=0.01), named)]
    if name == "sparseadam":
        table = [(n, p) for n, p in named if n.startswith("table")]
        mlp = [(n, p) for n, p in named if n.startswith("mlp")]
        return [
            (torch.optim.SparseAdam([p for _, p in table], lr=0.05), table),
            (torch.optim.Adam([p for _, p in mlp], lr=0.01), mlp),
        ]
    raise ValueError(name)


Sample = tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]


def global_batches(
    steps: int = STEPS,
) -> list[tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]]:
    """Each step's bags (ids drawn Zipf-like: a few rows in most bags), dense
    features and labels."""
    g = torch.Generator().manual_seed(11)
    weights = 1.0 / torch.arange(1, ROWS + 1, dtype=torch.float64) ** 1.1
    out = []
    for _ in range(steps):
        bags = [
            torch.multinomial(
                weights, int(torch.randint(1, 5, (1,), generator=g)), True, generator=g
            )
            for _ in range(GLOBAL_BATCH)
        ]
        x = torch.randn(GLOBAL_BATCH, 4, generator=g)
        y = torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)
        out.append((bags, x, y))
    return out


def loss_of(
    model: Model, bags: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    ids = torch.cat(bags)
    offsets = torch.tensor([0, *[len(b) for b in bags[:-1]]]).cumsum(0)
    return nn.functional.cross_entropy(model(ids, offsets, x), y)


def reference(name: str, steps: int = STEPS, server: bool = False) -> list[torch.Tensor]:
    """One process over the global batches (``server``: from the server table's start)."""
    model = Model(42, reference=server)
    opts = [o for o, _ in optimizers(name, model)]
    for bags, x, y in global_batches(steps):
        for o in opts:
            o.zero_grad()
        loss_of(model, bags, x, y).backward()
        for o in opts:
            o.step()
    return parameters(model)


def train_worker(
    name: str,
    sizes: tuple[int, ...],
    rank: int,
    context: object = None,
    steps: int = STEPS,
    on_step: Callable[[int], None] | None = None,
    server: bool = False,
    prefetch: str = "",
    counters: dict | None = None,
    hot: int = 0,
) -> list[torch.Tensor]:
    """Train as worker ``rank`` of ``len(sizes)`` (the job is the default one unless
    ``context``), with the import swapped: ``trimtab.DistributedOptimizer``, from the
    optimizers' clock (a job resumed from a checkpoint skips the steps before it). With a
    ``server`` table, ``prefetch`` "after" (or "before") step() announces the next
    batch's ids ("half": half of them, after), ``hot`` rows of it are replicated here;
    ``counters`` gets the table's rows read (``first``: by the first forward) and
    prefetched, and its hot set's report."""
    import trimtab

    model = Model(42 if rank == 0 else 1000 + rank, server, hot=hot)  # the root's values must win
    opts = [
        trimtab.DistributedOptimizer(inner, named, context=context)  # type: ignore[arg-type]
        for inner, named in optimizers(name, model)
    ]
    # Horovod's recipe (a table on the servers is left out of it); not in a job resumed
    # from a checkpoint, whose servers hold the values (docs/running.md)
    if context is None and opts[0].clock == 0:
        trimtab.broadcast_parameters(model.state_dict(), root_rank=0)
        for o in opts:
            trimtab.broadcast_optimizer_state(o, root_rank=0)
    start = sum(sizes[:rank])
    end = start + sizes[rank]
    batches = global_batches(steps)
    table: Any = model.table
    first = opts[0].clock  # 0, or a resumed job's checkpoint's clock
    for step, (bags, x, y) in enumerate(batches):
        if step < first:  # done before the checkpoint this job resumed from
            continue
        for o in opts:
            o.batch_size = sizes[rank]
            o.zero_grad()
        loss_of(model, bags[start:end], x[start:end], y[start:end]).backward()
        coming = torch.cat(batches[step + 1][0][start:end]) if step + 1 < steps else None
        if prefetch == "before" and coming is not None:
            table.prefetch(coming)
        for o in opts:
            o.step()
        if prefetch == "after" and coming is not None:
            table.prefetch(coming)
        if prefetch == "half" and coming is not None:  # (the forward reads the rest)
            table.prefetch(coming[: coming.numel() // 2])
        if on_step is not None:
            on_step(step)
        if step == 0 and counters is not None and server:
            counters["first"] = table.rows_read  # (no prefetch before the first step)
    if counters is not None and server:
        counters.update(read=table.rows_read, prefetched=table.rows_prefetched)
        counters["storage"] = table.weight.untyped_storage().nbytes()
        counters["hot"] = table.hot_report()
    return parameters(model)


def parameters(model: Model) -> list[torch.Tensor]:
    """The model's parameters, a server table's read from the servers."""
    import trimtab.nn

    table = model.table
    mlp = [p.detach().clone() for p in model.mlp.parameters()]
    if isinstance(table, trimtab.nn.EmbeddingBag):
        return [table.full_weight(), *mlp]
    return [table.weight.detach().clone(), *mlp]


def max_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))
