"""The simulator's data path: FIFO queues in numpy against a plain loop, and one step's
timing against what the links and speeds allow."""

from __future__ import annotations

import numpy as np
import pytest

from trimtab_tools.sim.datapath import StepInput, fifo, ready_shares, step_times


def _fifo_loop(group: np.ndarray, arrival: np.ndarray, service: np.ndarray) -> np.ndarray:
    end = np.empty(arrival.size)
    free: dict[int, float] = {}
    for i in sorted(range(arrival.size), key=lambda i: (group[i], arrival[i], i)):
        g = int(group[i])
        end[i] = max(arrival[i], free.get(g, -np.inf)) + service[i]
        free[g] = end[i]
    return end


@pytest.mark.parametrize("seed", range(5))
def test_fifo_matches_a_plain_queue_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 300
    group = rng.integers(0, 7, n)
    arrival = rng.uniform(0, 5, n)
    service = rng.uniform(0, 0.1, n)
    assert np.allclose(fifo(group, arrival, service), _fifo_loop(group, arrival, service))
    # Ties are served in some order: with equal services, each queue's ends are the same.
    tied, same = arrival.round(1), np.full(n, 0.05)
    ends, expected = fifo(group, tied, same), _fifo_loop(group, tied, same)
    for g in range(7):
        assert np.allclose(np.sort(ends[group == g]), np.sort(expected[group == g]))


def test_fifo_of_nothing_is_nothing() -> None:
    empty = np.zeros(0)
    assert fifo(empty.astype(int), empty, empty).size == 0


def _step(**changes: object) -> StepInput:
    sizes = np.array([1e6, 1e6, 1e6, 1e6])
    base: dict[str, object] = dict(
        starts=np.zeros(2),
        compute=np.array([0.1, 0.1]),
        sizes=sizes,
        owners=np.array([0, 1, 0, 1]),
        shares=ready_shares(sizes, 1 / 3),
        available=np.full(4, -np.inf),
        proc=np.full(2, 1e12),
        cap=np.full(2, np.inf),
        delay=np.zeros(2),
        update_bps=1e12,
        worker_nic_bps=1e12,
        server_nic_bps=1e8,
        latency_s=0.0,
    )
    base.update(changes)
    return StepInput(**base)  # type: ignore[arg-type]


def test_a_step_is_bound_by_the_server_nics_when_they_are_the_bottleneck() -> None:
    t = step_times(_step())
    # Each server takes 2 workers x 2 chunks x 1 MB in and as much out at 100 MB/s. The
    # first tensor's chunk is ready last, as the compute ends (0.1 s): its 2 pushes
    # (0.02 s) and 2 replies (0.02 s) follow; the others were sent during backward.
    assert t.ends.max() == pytest.approx(0.1 + 0.02 + 0.02, rel=1e-3)
    assert np.allclose(t.nbytes, [8e6, 8e6])
    assert (t.busy_s > 0).all() and (t.span_s > 0).all() and (t.tail_s > 0).all()


def test_a_capped_server_slows_the_step_and_shows_in_its_figures() -> None:
    fast = step_times(_step())
    slow = step_times(_step(cap=np.array([np.inf, 1e7])))
    assert slow.ends.max() > 3 * fast.ends.max()
    speed = slow.nbytes / slow.busy_s
    assert speed[1] == pytest.approx(1e7, rel=0.01)  # bytes per busy second = its cap
    assert speed[0] > 5 * speed[1]


def test_shared_nics_and_a_late_handover_make_a_step_longer() -> None:
    alone = step_times(_step()).ends.max()
    shared = step_times(_step(servers_per_host=2)).ends.max()
    late = step_times(_step(available=np.array([1.0, -np.inf, -np.inf, -np.inf]))).ends.max()
    assert shared > 1.5 * (alone - 0.1)
    assert late > 1.0


def test_backward_makes_the_last_tensor_ready_first() -> None:
    shares = ready_shares(np.array([1.0, 1.0, 2.0]), 0.25)
    assert shares[2] < shares[1] < shares[0] == pytest.approx(1.0)
    assert shares[2] == pytest.approx(0.25 + 0.75 * 0.5)


def test_a_server_that_answers_pushes_moved_has_no_figure_that_step() -> None:
    # Server 0 owns chunks 0, 2 and 3 on a 10 MB/s link; chunks 0 and 2 were cut at
    # this step's round (issue 38): their pushes still cross to it and it answers them
    # moved. The span then holds every push's crossing (6 MB at 10 MB/s) and chunk 3's
    # replies (2 MB), over the bytes of chunk 3 alone: a third of its speed, which made
    # PSLD move more chunks off it. The workers take no figure of it for that step.
    shape = {"owners": np.array([0, 1, 0, 0]), "link": np.array([1e7, np.inf])}
    whole = step_times(_step(**shape, shares=np.ones(4), in_order=True))
    moved = np.array([True, False, True, False])
    cut = step_times(_step(**shape, shares=np.ones(4), in_order=True, moved=moved))
    assert whole.seen_bytes[0] == 3 * 2 * 2 * 1e6 and cut.seen_bytes[0] == 1 * 2 * 2 * 1e6
    assert whole.span_s[0] == pytest.approx(0.8, rel=0.01)
    assert cut.span_s[0] == 0.0 and cut.tail_s[0] == 0.0  # no figure (observe_step skips)
    assert cut.seen_bytes[1] == whole.seen_bytes[1] and cut.span_s[1] == whole.span_s[1]
    assert cut.busy_s[0] < whole.busy_s[0]  # nothing merged or updated for them


def test_pushes_go_last_tensor_first_unless_in_order() -> None:
    # All gradients at the compute's end: server 0's chunk 3 (the last) is pushed first
    # by backward's order, last in the parameters' order: its replies then come later.
    shape = {"owners": np.array([1, 1, 1, 0]), "shares": np.ones(4), "server_nic_bps": 1e7}
    backward = step_times(_step(**shape))
    in_order = step_times(_step(**shape, in_order=True))
    assert in_order.first_in[0] > backward.first_in[0]
    assert in_order.first_in[1] < backward.first_in[1]


def test_a_span_starts_when_its_worker_began_sending_the_tensor() -> None:
    # Two tensors of two chunks, pushed in order over a worker NIC of 10 MB/s (0.1 s a
    # chunk), from the compute's end (0.1 s). Server 1 owns chunk 3 only: a worker reads
    # the clock when it begins sending tensor 1 (chunk 2, at 0.3 s), not at the
    # compute's end (issue 38: the bed's slow server read faster than the simulated).
    shape: dict[str, object] = {
        "owners": np.array([0, 0, 0, 1]),
        "shares": np.ones(4),
        "in_order": True,
        "worker_nic_bps": 1e7,
    }
    t = step_times(_step(**shape, tensors=np.array([0, 0, 1, 1])))
    alone = step_times(_step(**shape))  # a chunk a tensor: from chunk 3's own send
    assert t.span_s[1] == pytest.approx(t.ends.max() - 0.3, rel=1e-6)
    assert alone.span_s[1] == pytest.approx(t.ends.max() - 0.4, rel=1e-6)
    assert t.tail_s[1] == pytest.approx(t.span_s[1])  # the wait began before the send
    assert t.span_s[0] == pytest.approx(alone.span_s[0])  # chunk 0 left at the end
    assert np.array_equal(t.ends, alone.ends)  # the timing is the same


def _one_server(starts: list[float]) -> StepInput:
    """Two workers, one server, four 1 MB chunks handed over at the compute's end, a
    link of 100 MB/s each way (10 ms a chunk) and fast NICs at the workers."""
    sizes = np.full(4, 1e6)
    return _step(
        starts=np.array(starts),
        compute=np.zeros(2),
        sizes=sizes,
        owners=np.zeros(4, dtype=int),
        shares=np.ones(4),
        available=np.full(4, -np.inf),
        proc=np.full(1, 1e12),
        cap=np.full(1, np.inf),
        delay=np.zeros(1),
        in_order=True,
    )


def test_a_late_workers_pushes_take_turns_with_an_early_ones_as_credit_makes_them() -> None:
    # Issue 38: each worker has one chunk in flight to a server (the credit window), so
    # a worker 10 ms late does not find the other's four pushes queued ahead of its
    # first: they take turns and chunk 0 is done after 2 chunks' time, not 5.
    t = step_times(_one_server([0.0, 0.01]))
    assert t.updated[0] == pytest.approx(0.02, rel=1e-3)
    # Both pushing at once, the link is as busy as before: 8 pushes, then the last replies.
    together = step_times(_one_server([0.0, 0.0]))
    assert together.updated.max() == pytest.approx(0.08, rel=1e-3)


def test_a_chunks_replies_go_one_after_another_the_first_pusher_first() -> None:
    # The runtime's server answers a round's pushes in the order they came (on the
    # test bed's trace, 864 of 864): worker 1, a millisecond earlier, has its last reply
    # one reply (10 ms) before worker 0, where both once ended together.
    t = step_times(_one_server([0.001, 0.0]))
    assert t.ends[0] - t.ends[1] == pytest.approx(0.01, rel=1e-2)
    # ...and so times the server over a shorter wait: the upper bound lies above the lower.
    assert t.tail_s[0] < t.span_s[0]
