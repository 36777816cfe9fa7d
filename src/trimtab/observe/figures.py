"""The figures a training script reports to the launcher: marker lines on its output.

A worker's script that prints ``TRIMTAB_PROGRESS {"step": 120, "total": 600, "loss":
0.41, "accuracy": 0.87}`` (JSON after the prefix; every key optional) has its loss and
accuracy on ``trimtab run``'s status line (:mod:`.terminal`) and ``trimtab train``'s
progress bar; ``TRIMTAB_RESULT {...}`` is the job's result. The built-in example
(:mod:`trimtab.examples.digits`) prints both. Pure: no torch, no I/O.
"""

from __future__ import annotations

import json
import math
from typing import Any

#: A progress line: this prefix, then JSON with ``step``, ``total`` and maybe ``loss``,
#: ``accuracy``.
PROGRESS = "TRIMTAB_PROGRESS "
#: The result line: this prefix, then JSON with the job's results.
RESULT = "TRIMTAB_RESULT "
#: The figures the status line shows, in its order, and the result keys read as them.
SHOWN = ("loss", "accuracy")
_RESULT_KEYS = {"final_loss": "loss", "test_accuracy": "accuracy", "accuracy": "accuracy"}


def reported(line: str) -> dict[str, float]:
    """The figures a script's output ``line`` reports (``loss``, ``accuracy``), or {}
    for any other line (or a malformed marker: a script's typo must not end the job).
    Never raises."""
    if line.startswith(PROGRESS):
        keys = {k: k for k in SHOWN}
        raw = line[len(PROGRESS) :]
    elif line.startswith(RESULT):
        keys, raw = _RESULT_KEYS, line[len(RESULT) :]
    else:
        return {}
    try:
        data: Any = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    out = {}
    for key, name in keys.items():
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[name] = float(value)
    return out


def figures_text(figures: dict[str, float]) -> str:
    """`` | loss 0.412 | accuracy 0.870`` for the figures known, else ''."""
    return "".join(f" | {name} {figures[name]:.3f}" for name in SHOWN if name in figures)
