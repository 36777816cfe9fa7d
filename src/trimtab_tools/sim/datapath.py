"""The timing of one synchronous step through the data path, every push and reply a job
in a chain of first-in-first-out queues (vectorised with numpy).

One step of W workers and C chunks is ``W * C`` pushes and as many replies. Each goes
through the queues of the real path, in order:

1. the worker host's NIC out (shared by its workers): a chunk's push leaves once
   backward produced its gradient (chunks come last tensor first, over the backward
   share of the worker's compute); then the worker's credit window to the server
   (the runtime's default, one chunk in flight to each server: a worker sends its
   next push there once the last one was read), modelled as each worker's pushes to
   one server entering its link at most at its share (1/W of the link): so the
   workers' pushes to a server take turns, as on the test bed (a worker's pushes to a
   fast server came 6.84 ms apart, two 256 KiB chunks at 76.7 MB/s, while both
   pushed), instead of one worker's queueing ahead of another's;
2. the link's latency, then the server host's NIC in (shared by its servers);
3. the owning server's merge (its processing speed, its ``bandwidth`` cap and its
   ``delay``), not before the chunk reached it if a migration is handing it over;
4. once every worker's push of a chunk is merged, the server's optimizer update
   (one queue per server, chunks in the order they became ready);
5. the server host's NIC out: the updated chunk to every worker (PHub's pull
   elision: no pull requests), the W replies of a chunk one after another, to the
   workers in the order their pushes were merged (as the runtime's server answers
   them), then the latency and the worker host's NIC in. So the workers' steps end
   apart, by a reply's time on the server's link for the last chunk.

A queue serves its jobs in arrival order, each for ``bytes / rate`` seconds, from the
later of its arrival and the previous job's end; :func:`fifo` computes every job's end
at once (a segmented running maximum). A worker's step ends when its last reply is in
(and its compute is done). A message also costs ``message_s`` of CPU at each
end (0 unless calibrated). What it leaves out: TCP's congestion control, CPU shared
between the nodes of one machine (each node computes alone), the overlap of
a queue's jobs (one at a time, store and forward), migration traffic's share of the
links (a moving chunk is only late at its new owner), the credit window on values (a
server's one value in flight to each worker) and a worker pushing alone to a server
(its share stays 1/W: on the bed one pushing alone went at about 70% of the link, the
credits coming back behind the values).

Pure: every input is an argument; never blocks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["StepInput", "StepTimes", "fifo", "queue_order", "ready_shares", "step_times"]


def queue_order(group: np.ndarray, arrival: np.ndarray) -> np.ndarray:
    """The order a set of first-in-first-out queues serves its jobs in: by ``group``
    (integers >= 0), then by arrival (ties in any order). Pure."""
    if arrival.size == 0:
        return np.arange(0)
    key = group * (float(arrival.max() - arrival.min()) + 1.0) + (arrival - arrival.min())
    if bool(np.all(key[1:] >= key[:-1])):
        return np.arange(key.size)  # laid out in order already: no sort
    return np.argsort(key)


def fifo(
    group: np.ndarray,
    arrival: np.ndarray,
    service: np.ndarray,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """Each job's end in its group's first-in-first-out queue (one queue per distinct
    ``group`` value, integers >= 0). ``order``: :func:`queue_order` of the jobs, if the
    caller knows it. Arrays of one length; pure."""
    n = arrival.size
    if n == 0:
        return arrival.copy()
    if order is None:
        order = queue_order(group, arrival)
    g, a, s = group[order], arrival[order], service[order]
    first = np.empty(n, dtype=bool)
    first[0] = True
    np.not_equal(g[1:], g[:-1], out=first[1:])
    segment = np.cumsum(first) - 1
    done = np.cumsum(s)
    starts = np.flatnonzero(first)
    within = done - (done[starts] - s[starts])[segment]  # service up to and with the job
    slack = a - (within - s)
    # end_k = within_k + max over j <= k of (a_j - within before j), per segment: a
    # running maximum made not to cross segments by lifting each one above the last.
    lift = (float(slack.max() - slack.min()) + 1.0) * segment
    end = within + (np.maximum.accumulate(slack + lift) - lift)
    out = np.empty(n)
    out[order] = end
    return out


def ready_shares(sizes: np.ndarray, forward_share: float) -> np.ndarray:
    """When each chunk's gradient is ready, as a share of the step's compute: after the
    forward share, backward produces chunks last first, in proportion to their bytes."""
    after = np.cumsum(sizes[::-1])[::-1]  # bytes of this chunk and those after it
    return forward_share + (1 - forward_share) * after / max(float(sizes.sum()), 1.0)


@dataclasses.dataclass(frozen=True)
class StepInput:
    """One step's inputs.

    Attributes:
        starts, compute: each worker's start (seconds) and compute seconds (W,).
        sizes, owners: each chunk's bytes and owning server (C,).
        shares: :func:`ready_shares` of the chunks (C,).
        available: when each chunk's owner holds it (a migration's handover), (C,).
        proc, cap, delay: each server's merge bytes/s, link cap bytes/s (inf: none),
            extra seconds per byte (S,).
        update_bps, worker_nic_bps, server_nic_bps, latency_s, message_s: the
            cluster's.
        workers_per_host, servers_per_host: nodes sharing a NIC.
        link: each server's shaped link bytes/s, not busy time (S,; None: none).
        moved: chunks whose pushes this step their owner answers *moved* (C,; None:
            none): a migration cut at the round under way (``roles/server/cuts.py``).
            Their pushes cross to the owner, which merges nothing and answers with a
            message (no bytes, no update); the owner has no figure that step
            (``frontend/pusher.py``'s ``take_traffic``).
        in_order: a worker's pushes leave in the chunks' order (gradients handed over
            together to ``optimizer.step()``), not last tensor first (backward's).
        meter_push_s: busy seconds a server's load meter counts per push it merges and
            answers, where calibrated (it then replaces the model's handler times in
            the busy seconds, not in the timing; None: those handler times).
        tensors: each chunk's tensor (C,; None: each chunk a tensor of its own). A
            worker times a server's span from when it began sending the first tensor
            with a chunk there (``frontend/pusher.py`` reads the clock once a tensor,
            before its chunks' pushes), not from the compute's end.
    """

    starts: np.ndarray
    compute: np.ndarray
    sizes: np.ndarray
    owners: np.ndarray
    shares: np.ndarray
    available: np.ndarray
    proc: np.ndarray
    cap: np.ndarray
    delay: np.ndarray
    update_bps: float
    worker_nic_bps: float
    server_nic_bps: float
    latency_s: float
    workers_per_host: int = 1
    servers_per_host: int = 1
    message_s: float = 0.0
    link: np.ndarray | None = None
    moved: np.ndarray | None = None
    in_order: bool = False
    meter_push_s: float | None = None
    tensors: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """One step's outcome.

    Attributes:
        ends: when each worker has every reply (W,).
        compute_ends: when each worker's compute ended (W,).
        updated: when each chunk's update was done (C,).
        busy_s, nbytes: each server's busy seconds and bytes in and out (S,).
        span_s, tail_s, seen_bytes: per server, what the workers observed (as the
            coordinator gathers their reports): the longest span from a worker's first
            push to its last reply, the shortest from the start of its wait, and every
            worker's bytes both ways (S,; 0 for a server owning nothing).
        first_in: per server, when the step's first push was in (S,; inf: none).
        first_queued: per server, when the step's first push entered its inbound
            queue (its NIC's, or its shaped link's), a link's latency after it left the
            worker (S,; inf: none). A message that enters the queue later is read after
            that push (a FIFO: the test bed's ``tbf``, a NIC's ring).
    """

    ends: np.ndarray
    compute_ends: np.ndarray
    updated: np.ndarray
    busy_s: np.ndarray
    nbytes: np.ndarray
    span_s: np.ndarray
    tail_s: np.ndarray
    seen_bytes: np.ndarray
    first_in: np.ndarray
    first_queued: np.ndarray


def _per_worker_order(w_count: int, columns: np.ndarray) -> np.ndarray:
    """The queue order of ``w_count`` workers' jobs laid out worker-major, each worker
    on its own NIC, when every worker's jobs arrive in the column order ``columns``."""
    c_count = columns.size
    order: np.ndarray = (np.arange(w_count)[:, None] * c_count + columns[None, :]).ravel()
    return order


def step_times(x: StepInput) -> StepTimes:
    """The step's timing (see the module). Pure; arrays must agree in shape."""
    w_count, c_count, s_count = x.starts.size, x.sizes.size, x.proc.size
    sizes = x.sizes.astype(float)
    owners = x.owners.astype(np.int64)
    compute_ends = x.starts + x.compute
    ready = x.starts[:, None] + x.compute[:, None] * x.shares[None, :]
    worker_host = np.repeat(np.arange(w_count) // x.workers_per_host, c_count)
    server_host = np.tile(owners // x.servers_per_host, w_count)
    flat_sizes = np.tile(sizes, w_count)
    alone = x.workers_per_host == 1
    # Pushes: worker NIC out (a worker's chunks come last first), latency, server NIC
    # in, then the owner's merge (after a moving chunk's handover).
    columns = np.arange(c_count) if x.in_order else np.arange(c_count)[::-1]
    backward = _per_worker_order(w_count, columns) if alone else None
    per_message = x.message_s
    out_each = flat_sizes / x.worker_nic_bps + per_message
    out_w = fifo(worker_host, ready.ravel(), out_each, backward)
    # When each push began to leave (its queue's service starts), as a worker times it.
    pushed = _tensor_starts((out_w - out_each).reshape(w_count, c_count), x.tensors)
    link = np.full(s_count, np.inf) if x.link is None else x.link
    nic_in = np.maximum(1 / x.server_nic_bps, 1 / link[np.tile(owners, w_count)])
    if w_count > 1:  # the credit window: a worker's pushes to a server at its share
        pair = np.repeat(np.arange(w_count) * s_count, c_count) + np.tile(owners, w_count)
        share = w_count * flat_sizes * nic_in
        # (each worker's pushes to one server come in its NIC's order)
        turns = columns[np.argsort(owners[columns], kind="stable")]
        out_w = fifo(pair, out_w, share, _per_worker_order(w_count, turns) if alone else None)
        out_w -= share
    arrive = out_w + x.latency_s
    order = queue_order(server_host, arrive)
    in_s = fifo(server_host, arrive, flat_sizes * nic_in, order)
    merge_each = (
        sizes * np.maximum(1 / x.proc[owners], 1 / x.cap[owners])
        + sizes * x.delay[owners]
        + per_message
    )
    kept = np.ones(c_count) if x.moved is None else (~x.moved).astype(float)
    merge_each = merge_each * kept + per_message * (1 - kept)  # a moved push: one answer
    handing = bool(np.isfinite(x.available).any())
    if handing:
        in_s = np.maximum(in_s, np.tile(x.available, w_count))
    same = x.servers_per_host == 1 and not handing  # then the merge keeps the NIC's order
    server = np.tile(owners, w_count)
    merged = fifo(server, in_s, np.tile(merge_each, w_count), order if same else None)
    merged = merged.reshape(w_count, c_count)
    # Updates: each chunk once every worker's push is merged.
    update_each = kept * sizes / (x.update_bps * x.proc[owners] / x.proc.max(initial=1.0))
    updated = fifo(owners, merged.max(axis=0), update_each)
    # Replies: the updated chunk to every worker, one reply after another through the
    # server NIC out (and its cap), the first pusher's first (the runtime's server
    # answers a round's pushes in the order they came: 864 of 864 on the test bed's
    # trace); then the latency and the worker's NIC in.
    slowest = np.maximum(np.maximum(1 / x.server_nic_bps, 1 / x.cap[owners]), 1 / link[owners])
    reply_each = kept * sizes * slowest + per_message
    sent = fifo(owners // x.servers_per_host, updated, reply_each * w_count)
    replied = sent[None, :] - (w_count - 1 - _arrival_ranks(merged)) * reply_each[None, :]
    got_order = None
    if alone:  # each worker's replies in the order they reach it
        got_order = (np.argsort(replied, axis=1) + np.arange(w_count)[:, None] * c_count).ravel()
    got = fifo(
        worker_host,
        (replied + x.latency_s).ravel(),
        np.tile(sizes * kept, w_count) / x.worker_nic_bps + per_message,
        got_order,
    ).reshape(w_count, c_count)
    ends = np.maximum(compute_ends, got.max(axis=1, initial=0.0))
    # A server's busy seconds are its handlers' (as its LoadMeter counts them): the
    # merge, the update, a reply's CPU and a throttle's pacing, not its NIC's time.
    reply_busy = kept * sizes / x.cap[owners] + per_message
    busy = np.bincount(owners, (merge_each + reply_busy) * w_count + update_each, s_count)
    if x.meter_push_s is not None:  # the meter's figure, calibrated (a moved push: one answer)
        metered = kept * x.meter_push_s + (1 - kept) * per_message
        busy = np.bincount(owners, metered * w_count, s_count)
    nbytes = np.bincount(owners, sizes * (1 + kept) * w_count, s_count)
    read = np.maximum(got, compute_ends[:, None])  # replies are read during the wait
    span, tail = _spans(pushed, read, compute_ends, owners, s_count)
    if x.moved is not None and x.moved.any():  # a server that turned a push away
        span[owners[x.moved]] = 0.0  # has no figure that step (pusher.take_traffic)
        tail[owners[x.moved]] = 0.0
    first_in = np.full(s_count, np.inf)
    np.minimum.at(first_in, owners, in_s.reshape(w_count, c_count).min(axis=0))
    first_queued = np.full(s_count, np.inf)
    np.minimum.at(first_queued, owners, arrive.reshape(w_count, c_count).min(axis=0))
    return StepTimes(
        ends=ends,
        compute_ends=compute_ends,
        updated=updated,
        busy_s=busy,
        nbytes=nbytes,
        span_s=span,
        tail_s=tail,
        seen_bytes=nbytes
        if x.moved is None
        else np.bincount(owners, sizes * 2 * kept * w_count, s_count),
        first_in=first_in,
        first_queued=first_queued,
    )


def _arrival_ranks(merged: np.ndarray) -> np.ndarray:
    """Each worker's place among the workers in when its push of each chunk was merged
    (``merged``: (W, C); 0 the first, ties by rank). Pure."""
    w_count = merged.shape[0]
    if w_count == 1:
        return np.zeros(merged.shape, dtype=np.int64)
    order = np.argsort(merged, axis=0, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(w_count)[:, None], order.shape), 0)
    return ranks


def _tensor_starts(sent: np.ndarray, tensors: np.ndarray | None) -> np.ndarray:
    """Each push's start as its worker's clock reads it (``sent``: (W, C), each push's
    own): that of its tensor's first push sent (``tensors``: each chunk's, a tensor's
    chunks next to each other as ``make_chunks`` numbers them; None: as ``sent``). A
    worker reads the clock once a tensor, before sending its chunks."""
    if tensors is None or sent.size == 0:
        return sent
    cut = np.flatnonzero(np.r_[True, tensors[1:] != tensors[:-1]])
    if cut.size == tensors.size:  # a chunk a tensor
        return sent
    first = np.minimum.reduceat(sent, cut, axis=1)
    out: np.ndarray = np.repeat(first, np.diff(np.r_[cut, tensors.size]), axis=1)
    return out


def _spans(
    sent: np.ndarray, read: np.ndarray, waited: np.ndarray, owners: np.ndarray, count: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per server (``count`` of them; 0 for one owning nothing): the longest span over
    workers from the first push sent (``sent``: when each push began to leave, by its
    worker's clock) to the last reply read, and the shortest from the later of that push
    and the start of the wait (as ``reports.spans_of_step`` times them and the
    coordinator gathers them)."""
    order = np.argsort(owners, kind="stable")
    held = owners[order]
    cut = np.flatnonzero(np.r_[True, held[1:] != held[:-1]])
    first = np.minimum.reduceat(sent[:, order], cut, axis=1)
    last = np.maximum.reduceat(read[:, order], cut, axis=1)
    span, tail = np.zeros(count), np.zeros(count)
    span[held[cut]] = (last - first).max(axis=0)
    tail[held[cut]] = (last - np.maximum(first, waited[:, None])).min(axis=0)
    # A server whose every push was answered moved has no span (as one never replied).
    span[~np.isfinite(span)] = 0.0
    tail[~np.isfinite(tail)] = 0.0
    return span, tail
