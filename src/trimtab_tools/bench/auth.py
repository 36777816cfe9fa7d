"""``trimtab bench datapath --auth compare``: what the job's authentication costs.

In one run, interleaved round by round so that a machine's drift touches every mode
alike, the trimtab jobs of ``trimtab bench datapath`` with authentication on (the
default: a handshake per connection, a MAC per header), off (``--no-auth``, insecure)
and encrypted (``--encrypt``: ZeroMQ CURVE):
  * the 100 MiB push+pull step of 2 workers x 2 servers, by the default path (shared
    memory for chunks over 4 KiB, the local lane for messages: only headers are MACed);
  * the same step with every byte through TCP (``TRIMTAB_SHM=0``), as between machines:
    there ``--encrypt`` encrypts every payload byte;
  * 1 KiB round trips (1 worker, 1 server), where the per-message MAC weighs most.
Each figure is the median over rounds of each job's median; ratios are against ``off``.
"""

from __future__ import annotations

import statistics
from typing import Any

from trimtab_tools.bench.job import run_trimtab

MODES = ("on", "off", "encrypt")


def measure_auth(
    sizes: list[int],
    steps: int,
    chunk_bytes: int,
    small_bytes: int,
    small_steps: int,
    rounds: int = 3,
) -> dict[str, Any]:
    """Run the three jobs in every mode, ``rounds`` times interleaved. Blocks (about
    ``rounds`` x 40 s here); raises RuntimeError if a job fails."""
    runs: dict[str, dict[str, list[float]]] = {
        case: {mode: [] for mode in MODES} for case in ("step", "step_sockets", "small")
    }
    for _ in range(rounds):
        for mode in MODES:
            step = run_trimtab(sizes, steps, chunk_bytes, auth=mode)
            runs["step"][mode].append(statistics.median(step))
            sockets = run_trimtab(sizes, steps, chunk_bytes, shm=False, auth=mode)
            runs["step_sockets"][mode].append(statistics.median(sockets))
            small = run_trimtab(
                [small_bytes], small_steps, chunk_bytes, 1, 1, warmup=100, auth=mode
            )
            runs["small"][mode].append(len(small) / sum(small))
    out: dict[str, Any] = {
        "benchmark": "datapath-auth",
        "model_bytes": sum(sizes),
        "steps": steps,
        "small_bytes": small_bytes,
        "small_steps": small_steps,
        "rounds": rounds,
    }
    for case, by_mode in runs.items():
        unit = "ops_per_s" if case == "small" else "s"
        medians = {mode: statistics.median(v) for mode, v in by_mode.items()}
        for mode, value in medians.items():
            out[f"{case}_{mode}_{unit}"] = round(value, 5 if unit == "s" else 1)
        for mode in ("on", "encrypt"):
            out[f"{case}_{mode}_over_off"] = round(medians[mode] / medians["off"], 3)
        out[f"{case}_rounds"] = {m: [round(x, 5) for x in v] for m, v in by_mode.items()}
    return out
