"""``trimtab.nn``: modules whose parameters live on the servers.

``trimtab.nn.Embedding`` and ``trimtab.nn.EmbeddingBag`` take torch's signatures; their
tables exist only on the servers, as row blocks (see docs/sparse.md). ``growing=Growth(...)``
makes a table whose ids are any 64-bit values, admitted and evicted by rules."""

from __future__ import annotations

from trimtab.frontend.embedding import Embedding, EmbeddingBag
from trimtab.policies.growth import Growth

__all__ = ["Embedding", "EmbeddingBag", "Growth"]
