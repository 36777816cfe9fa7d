"""A Horovod user's script with the import swapped: ``import trimtab as hvd`` (a BytePS
user's: ``import trimtab.byteps.torch as bps``).

Usage (under ``trimtab run``): horovod_script.py PATTERN[:PHASE][,PATTERN[:PHASE]...] OUT_DIR
Runs each of :data:`tests.horovod_patterns.PATTERNS` [PATTERN] in turn, in one job (each
builds its own model and optimizers: a table of its own), with its PHASE if given (the
checkpoint's ``first`` or ``resume``), and saves each rank's final values as
``OUT_DIR/rank{r}.pt`` (one pattern) or ``OUT_DIR/PATTERN/rank{r}.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

import trimtab as hvd
import trimtab.byteps.torch as bps
from tests.horovod_patterns import PATTERNS

patterns, out = sys.argv[1].split(","), Path(sys.argv[2])
for entry in patterns:
    pattern, *phase = entry.split(":")
    where = out if len(patterns) == 1 else out / pattern
    where.mkdir(exist_ok=True)
    # A BytePS script imports trimtab.byteps.torch as bps; a Horovod one trimtab as hvd.
    result = PATTERNS[pattern](bps if pattern.startswith("byteps_") else hvd, where, *phase)
    torch.save(result, where / f"rank{hvd.rank()}.pt")
hvd.shutdown()
