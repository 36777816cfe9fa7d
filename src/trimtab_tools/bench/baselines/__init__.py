"""Physical and peer baselines for trimtab's datapath benchmark.

Four figures are measured in the same run as the datapath benchmark so that
trimtab's numbers can be read against them:

* :func:`tcp_ceiling_gbps` -- what one raw TCP stream over loopback moves between
  two processes (the ceiling any socket-based datapath on this host works under);
* :func:`gloo_allreduce_s` -- how long ``torch.distributed`` with the gloo backend
  takes to allreduce a given set of float32 tensors (the peer that trimtab is
  compared against);
* :func:`zmq_rtt_per_s` -- raw pyzmq REQ/REP round trips of a small payload between
  two processes (the ceiling for trimtab's small messages, which also ride ZeroMQ);
  with ``framed=True``, over trimtab's own socket pattern and framing (DEALER/ROUTER,
  a header frame and a payload frame), with nothing else in Python;
* :func:`ps_arithmetic_cpu_s` -- the CPU time of the merge, update and copies that a
  synchronous PS step does whatever its data path (the test bed's CPU floor).

:mod:`.leanps` (``--peers lean``) is a peer, not a figure of this host alone: the same
2 x 2 step as trimtab's, in plain Python over pyzmq with nothing else, whose processes
run where trimtab's roles run (on loopback or a test bed's hosts).

All spawn helper processes (``multiprocessing`` "spawn" context), bind and connect
on 127.0.0.1 only, and never hang: every wait has a timeout, and helper processes
that outlive it are terminated. Importing this module has no side effects; torch
is only imported inside the functions that need it.
"""

from trimtab_tools.bench.baselines.arith import ps_arithmetic_cpu_s
from trimtab_tools.bench.baselines.gloo import gloo_allreduce_s
from trimtab_tools.bench.baselines.tcp import memcpy_gbps, tcp_ceiling_gbps
from trimtab_tools.bench.baselines.zmq_rtt import zmq_rtt_per_s

__all__ = [
    "gloo_allreduce_s",
    "memcpy_gbps",
    "ps_arithmetic_cpu_s",
    "tcp_ceiling_gbps",
    "zmq_rtt_per_s",
]
