"""The marker lines the benchmarks' worker scripts print for their drivers to read.

Apart from the worker scripts (which import torch) so that ``trimtab bench``'s driver
and its flags load without torch.
"""

from pathlib import Path

#: The result line of ``_datapath_worker`` and ``_overlap_worker``: this, then JSON.
RESULT = "TRIMTAB_BENCH "
#: Printed by ``_datapath_worker --go-file`` once warmed up, and when its timed steps end
#: (the profiler samples in between).
READY = "TRIMTAB_BENCH_READY"
DONE = "TRIMTAB_BENCH_DONE"


def read_file(go_file: Path) -> Path:
    """The file the profiler makes once it read the counters after :data:`DONE`: every
    worker waits for it, so that no thread of the job has ended before they were read.
    Pure."""
    return go_file.with_name(go_file.name + ".read")
