"""The marker lines the benchmarks' worker scripts print for their drivers to read.

Apart from the worker scripts (which import torch) so that ``trimtab bench``'s driver
and its flags load without torch.
"""

#: The result line of ``_datapath_worker`` and ``_overlap_worker``: this, then JSON.
RESULT = "TRIMTAB_BENCH "
#: Printed by ``_datapath_worker --hold`` once warmed up, and when its timed steps end
#: (the profiler samples in between).
READY = "TRIMTAB_BENCH_READY"
DONE = "TRIMTAB_BENCH_DONE"
