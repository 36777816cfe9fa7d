"""Worker of the MXNet peer in ``trimtab bench datapath --peers mxnet``.

Runs under the MXNet venv's interpreter, never trimtab's (it imports neither trimtab nor
torch), as one ps-lite worker of a ``dist_sync`` KVStore job that
:mod:`trimtab_tools.bench.mxnet_peer` starts. It does what ``_datapath_worker.py`` does for
trimtab: one key per tensor, SGD on the servers (``kv.set_optimizer``, as MXNet's Module
does with ``update_on_kvstore``), and each timed step pushes every gradient and pulls
every updated value, then waits for the pulls. The worker that ps-lite ranks 0 prints one
result line after a marker.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import time
from typing import Any

RESULT = "MXNET_BENCH "
LR = 0.1
GRAD = 1e-3
#: ps-lite's default when MXNET_KVSTORE_BIGARRAY_BOUND is unset: arrays of more elements
#: are split evenly over every server, smaller ones go whole to one server.
DEFAULT_BIGARRAY_BOUND = 1_000_000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", required=True, help="comma-separated tensor sizes in bytes")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    mx: Any = importlib.import_module("mxnet")
    kv = mx.kv.create("dist_sync")
    numels = [int(b) // 4 for b in args.sizes.split(",")]
    keys = list(range(len(numels)))
    weights = [mx.nd.zeros((n,)) for n in numels]
    grads = [mx.nd.zeros((n,)) for n in numels]
    kv.init(keys, weights)
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=LR, rescale_grad=1.0 / kv.num_workers))
    times = []
    for step in range(args.warmup + args.steps):
        # On CPU, MXNet's dist KVStore keeps the pushed array as the receive buffer of the
        # key's pull (no copy), so a pull leaves the new values in the gradient array. A
        # training step's backward overwrites it; here it is refilled, untimed.
        for g in grads:
            g[:] = GRAD
        mx.nd.waitall()
        start = time.perf_counter()
        kv.push(keys, grads)
        kv.pull(keys, out=weights)
        for w in weights:
            w.wait_to_read()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    # Every element moved by lr * mean gradient per step, on every server's slice.
    expected = -LR * GRAD * (args.warmup + args.steps)
    for got in (weights[0][0].asscalar(), weights[-1][-1].asscalar()):
        if abs(float(got) - expected) > 1e-6 + 1e-4 * abs(expected):
            raise SystemExit(f"MXNet produced wrong values: {got} != {expected}")
    if kv.rank == 0:
        bound = os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND")
        report = {
            "times": times,
            "version": mx.__version__,
            "bigarray_bound": int(bound) if bound else DEFAULT_BIGARRAY_BOUND,
        }
        print(RESULT + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
