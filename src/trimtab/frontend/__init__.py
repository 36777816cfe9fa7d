"""The Horovod-shaped PyTorch front end: ``init``/``rank``/``broadcast_*``, the
``DistributedOptimizer``, gradient compression."""
