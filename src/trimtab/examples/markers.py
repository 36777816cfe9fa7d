"""The marker lines the example job prints for ``trimtab train`` to read.

Apart from :mod:`trimtab.examples.digits` (which imports torch) so that the launcher
can read them without loading torch. They are defined with their reader, in
:mod:`trimtab.observe.figures` (any script may print them).
"""

from trimtab.observe.figures import PROGRESS as PROGRESS
from trimtab.observe.figures import RESULT as RESULT

__all__ = ["PROGRESS", "RESULT"]
