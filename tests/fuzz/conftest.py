"""The fuzz suite's hypothesis profiles: ``ci`` (the default: few examples, the whole
suite in well under a minute) and ``long``, for a run of its own::

    TRIMTAB_FUZZ_EXAMPLES=2000 pytest tests/fuzz    # or HYPOTHESIS_PROFILE=long

Examples are not stored between runs (no database): a CI run draws fresh ones, and a
finding is printed with the example that shows it.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("TRIMTAB_FUZZ_EXAMPLES", "0"))

_COMMON = {
    "deadline": None,  # a shared CI machine's pauses are not findings
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("ci", max_examples=EXAMPLES or 60, **_COMMON)
settings.register_profile("long", max_examples=EXAMPLES or 2000, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
