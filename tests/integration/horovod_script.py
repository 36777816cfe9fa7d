"""A Horovod user's script with the import swapped: ``import trimtab as hvd`` (a BytePS
user's: ``import trimtab.byteps.torch as bps``).

Usage (under ``trimtab run``): horovod_script.py PATTERN OUT_DIR [PHASE]
Runs :data:`tests.horovod_patterns.PATTERNS` [PATTERN] and saves each rank's final
values as ``OUT_DIR/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab as hvd
import trimtab.byteps.torch as bps
from tests.horovod_patterns import PATTERNS

pattern, out = sys.argv[1], Path(sys.argv[2])
extra = sys.argv[3:]
# A BytePS script imports trimtab.byteps.torch as bps; a Horovod one trimtab as hvd.
result = PATTERNS[pattern](bps if pattern.startswith("byteps_") else hvd, out, *extra)
torch.save(result, out / f"rank{hvd.rank()}.pt")
hvd.shutdown()
