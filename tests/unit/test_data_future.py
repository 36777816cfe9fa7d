"""A worker's DataFuture keeps the contract of concurrent.futures.Future without its
condition: completing it wakes a thread that sleeps on it, once, with the outcome."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from trimtab.errors import NodeTimeout, RemoteError
from trimtab.roles.worker.replies import DataFuture, Reply, wait


class _Idle:
    """A receiver that reads nothing (another thread completes the future)."""

    def __init__(self) -> None:
        self.driven = 0

    def drive(self, fut: DataFuture, timeout_s: float) -> None:
        self.driven += 1


def _future(client: _Idle | None = None) -> DataFuture:
    return DataFuture(client or _Idle(), 3, "tcp://127.0.0.1:1", 7)


def test_a_reply_set_by_another_thread_wakes_the_sleeper() -> None:
    fut = _future()
    reply = Reply({"o": 1}, [], 1.0)
    got: list[Reply] = []
    sleeper = threading.Thread(target=lambda: got.append(fut.result(timeout=30)))
    sleeper.start()
    while not fut._sleepers:  # (it sleeps on its own lock: then complete it)
        threading.Event().wait(0.001)
    fut.set_result(reply)
    sleeper.join(30)
    assert got == [reply] and fut.done() and fut.exception() is None
    assert not sleeper.is_alive()


def test_an_exception_is_raised_to_every_reader() -> None:
    fut = _future()
    fut.set_exception(RemoteError("bad", "no"))
    for _ in range(2):
        with pytest.raises(RemoteError):
            fut.result(0)
    assert isinstance(fut.exception(0), RemoteError)


def test_it_is_completed_once() -> None:
    fut = _future()
    fut.set_result(Reply({}, []))
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_result(Reply({}, []))
    with pytest.raises(concurrent.futures.InvalidStateError):
        fut.set_exception(RemoteError("bad", "no"))


def test_a_result_not_there_in_time_times_out() -> None:
    fut = _future()
    with pytest.raises(concurrent.futures.TimeoutError):
        fut.result(timeout=0.01)
    assert not fut.done()
    fut.set_result(Reply({"o": 2}, []))  # a sleeper that gave up is no obstacle
    assert fut.result(0).header == {"o": 2}


def test_callbacks_run_once_whether_added_before_or_after() -> None:
    fut = _future()
    seen: list[str] = []
    fut.add_done_callback(lambda f: seen.append("before"))
    fut.add_done_callback(lambda f: 1 / 0)  # a failing callback is logged, not raised
    fut.set_result(Reply({}, []))
    fut.add_done_callback(lambda f: seen.append("after"))
    assert seen == ["before", "after"]


def test_cancel_as_a_future_does() -> None:
    fut = _future()
    assert fut.cancel() and fut.cancelled() and fut.done()
    with pytest.raises(concurrent.futures.CancelledError):
        fut.result(0)
    assert not fut.set_running_or_notify_cancel()
    other = _future()
    assert other.set_running_or_notify_cancel() and other.running()
    other.set_result(Reply({}, []))
    assert not other.cancel()


def test_wait_drives_the_receiver_then_times_out_at_once() -> None:
    client = _Idle()
    fut = _future(client)
    with pytest.raises(NodeTimeout):
        wait(fut, 5.0)  # (the receiver waited the 5 s: wait does not wait them again)
    assert client.driven == 1
