"""``trimtab.nn``: modules whose parameters live on the servers.

``trimtab.nn.Embedding`` and ``trimtab.nn.EmbeddingBag`` take torch's signatures; their
tables exist only on the servers, as row blocks (see docs/sparse.md)."""

from __future__ import annotations

from trimtab.frontend.embedding import Embedding, EmbeddingBag

__all__ = ["Embedding", "EmbeddingBag"]
