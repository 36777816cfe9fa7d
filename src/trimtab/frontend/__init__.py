"""The Horovod-shaped PyTorch front end.

- ``api``: ``init``/``rank``/``broadcast_*``; reads the environment, wires fault
  injection (step hooks) and owns the default context;
- ``optimizer``: ``DistributedOptimizer``, Horovod's contract, composed of
- ``pusher`` (each chunk's push, answer and write-back: the hot path),
- ``reports`` (step timings and what the coordinator answers) and
- ``overlap`` (``model=``: forward waits per module);
- ``compression``: gradient wire formats.
"""
