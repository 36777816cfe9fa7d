"""BytePS's names over trimtab: ``import trimtab.byteps.torch as bps`` (BytePS's
``import byteps.torch as bps``) or ``from trimtab.byteps import torch as bps``. The
functions live in :mod:`trimtab.frontend.byteps`."""
