"""The arithmetic a synchronous parameter-server step cannot skip, timed on this host.

For a model of ``total`` bytes of float32 in chunks of ``chunk`` bytes and ``workers``
workers, a step (as trimtab's servers and workers do it, each chunk in its own buffers):

* the servers merge the workers' gradients of each chunk, each scaled by its weight (the
  first copied in scaled, the others added);
* they apply the merged gradient to the chunk's value (SGD: ``value -= lr * merged``);
* every worker copies each updated chunk into its parameter.

:func:`ps_arithmetic_cpu_s` runs exactly those torch operations over distinct buffers
(as large as the step's, so the caches hold no more of them than in the job) and
returns the CPU time they took, all threads together. It is the part of a step's CPU
that no data path saves; with the kernel's CPU for the step's bytes (a raw stream's) it
makes the floor of a step where every host shares one machine's cores
(:mod:`trimtab_tools.bench.bed`).
"""

from __future__ import annotations

import statistics
import time

__all__ = ["ps_arithmetic_cpu_s"]

_LR = 0.1


def ps_arithmetic_cpu_s(total: int, chunk: int, workers: int = 2, repeats: int = 3) -> float:
    """CPU seconds (this process, every thread) of one step's merge, update and copies
    for a model of ``total`` bytes in ``chunk``-byte chunks, ``workers`` workers: the
    median of ``repeats`` after a warm-up. Blocks for ``repeats + 1`` passes (about a
    second for 100 MiB and 2 workers). Raises ValueError for sizes that are not positive
    multiples of 4 bytes, or fewer than one worker."""
    import torch

    if total <= 0 or chunk <= 0 or total % 4 or chunk % 4 or workers < 1 or repeats < 1:
        raise ValueError(
            f"need positive float32 sizes and at least one worker and repeat "
            f"(total={total}, chunk={chunk}, workers={workers}, repeats={repeats})"
        )
    numel, per = total // 4, chunk // 4
    grads = [torch.full((numel,), 1e-3) for _ in range(workers)]
    merged, value = torch.zeros(numel), torch.zeros(numel)
    params = [torch.zeros(numel) for _ in range(workers)]
    spans = [(start, min(per, numel - start)) for start in range(0, numel, per)]
    weight = 1.0 / workers
    times = []
    for i in range(repeats + 1):
        started = time.process_time()
        for start, n in spans:
            m = merged.narrow(0, start, n)
            torch.mul(grads[0].narrow(0, start, n), weight, out=m)
            for g in grads[1:]:
                m.add_(g.narrow(0, start, n), alpha=weight)
            v = value.narrow(0, start, n)
            v.add_(m, alpha=-_LR)
            for p in params:
                p.narrow(0, start, n).copy_(v)
        if i:  # the first pass is a warm-up (page faults of the fresh buffers)
            times.append(time.process_time() - started)
    expected = -_LR * 1e-3 * (repeats + 1)
    if abs(params[-1][-1].item() - expected) > 1e-6:  # the work was done, not elided
        raise RuntimeError(f"the arithmetic went wrong: {params[-1][-1].item()} != {expected}")
    return statistics.median(times)
