"""A synthetic click-through data set, DLRM-shaped, whose labels come from a hidden model,
and the model ``trimtab experiment sparse`` trains on it.

- :class:`Zipf`: ids drawn from a bounded Zipf(s) over ``n`` rows (NuPS's recipe:
  s = 1.1), the ranks scattered over the table by a fixed bijection (so the hot rows
  are not all in its first row blocks); ``s = 0``: uniform.
- :class:`CTR`: each sample is one bag of ids per table and dense features; its label is
  drawn from ``sigmoid(logit)`` of a hidden model (a hashed weight per id and a dense
  weight vector), so quality is measurable: log loss and AUC on held-out samples
  (:func:`log_loss`, :func:`auc`). Batches are functions of a seed and a step: every
  process makes the same global batch and takes its slice, none holds the data set.
- :func:`make_model`: tables (``EmbeddingBag``, pooled bags) and an MLP over their
  outputs and the dense features.

Pure functions of seeds; nothing blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import nn

DENSE = 8
_SCATTER = 2_654_435_761  # a prime: rank * _SCATTER mod n is a bijection unless it divides n


class Zipf:
    """Ids in ``[0, n)`` with ``P(rank k) ~ 1 / (k + 1)^s`` (``s = 0``: uniform)."""

    def __init__(self, n: int, s: float) -> None:
        self.n, self.s = n, s
        ranks = torch.arange(1, n + 1, dtype=torch.float64)
        self._cdf = torch.cumsum(ranks.pow(-s), 0) if s > 0 else None
        if self._cdf is not None:
            self._cdf /= self._cdf[-1].clone()

    def sample(self, count: int, g: torch.Generator) -> torch.Tensor:
        """``count`` ids (int64)."""
        if self._cdf is None:
            return torch.randint(0, self.n, (count,), generator=g)
        u = torch.rand(count, generator=g, dtype=torch.float64)
        rank = torch.searchsorted(self._cdf, u).clamp_(max=self.n - 1)
        return (rank * _SCATTER + 7) % self.n  # (a bijection where gcd(_SCATTER, n) = 1)


@dataclasses.dataclass(frozen=True)
class CTR:
    """The data set: ``tables`` tables of ``rows`` rows, bags of ``bag`` ids drawn from a
    Zipf(``s``), labels from a hidden model seeded with ``seed``."""

    rows: int
    tables: int = 4
    bag: int = 4
    s: float = 1.1
    seed: int = 3

    def batch(self, step: int, size: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Global batch ``step`` (held-out samples: a negative ``step``): per table its
        ids (``[size, bag]``), the dense features ``[size, DENSE]``, labels (0. or 1.)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        zipf = _zipf(self.rows, self.s)
        ids = [zipf.sample(size * self.bag, g).view(size, self.bag) for _ in range(self.tables)]
        dense = torch.randn(size, DENSE, generator=g)
        logit = self._hidden(ids, dense)
        labels = (torch.rand(size, generator=g) < torch.sigmoid(logit)).float()
        return ids, dense, labels

    def _hidden(self, ids: list[torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        h = torch.Generator().manual_seed(self.seed)
        w_dense = torch.randn(DENSE, generator=h) * 0.5
        logit = dense @ w_dense - 0.5
        for t, table in enumerate(ids):
            # A weight per id from a hash: no hidden table of the data set's size.
            hashed = ((table * 40503 + t * 977 + self.seed) % 65_521).double() / 65_521
            logit = logit + 2.0 * (hashed.mean(dim=1).float() - 0.5) * 3.0
        return logit


_zipfs: dict[tuple[int, float], Zipf] = {}


def _zipf(n: int, s: float) -> Zipf:
    key = (n, s)
    if key not in _zipfs:
        _zipfs[key] = Zipf(n, s)
    return _zipfs[key]


class DLRM(nn.Module):
    """Tables made by ``table(t)`` (torch's or trimtab's EmbeddingBag), pooled by mean,
    and an MLP over their outputs and the dense features: one logit."""

    def __init__(self, data: CTR, dim: int, table: Callable[[int], nn.Module], seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.mlp = nn.Sequential(
            nn.Linear(data.tables * dim + DENSE, 64), nn.ReLU(), nn.Linear(64, 1)
        )
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        self.tables = nn.ModuleList([table(t) for t in range(data.tables)])

    def forward(self, ids: list[torch.Tensor], dense: torch.Tensor) -> torch.Tensor:
        pooled = [tab(i) for tab, i in zip(self.tables, ids, strict=True)]
        out: torch.Tensor = self.mlp(torch.cat([*pooled, dense], dim=1))
        return out.squeeze(1)


def log_loss(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean binary cross-entropy of ``logits`` against ``labels``."""
    return float(nn.functional.binary_cross_entropy_with_logits(logits, labels))


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic over the scores' ranks)."""
    order = torch.argsort(scores)
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    positives = labels > 0.5
    n_pos, n_neg = int(positives.sum()), int((~positives).sum())
    if not n_pos or not n_neg:
        return 0.5
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
