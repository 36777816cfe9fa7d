"""The marker lines the example job prints for ``trimtab train`` to read.

Apart from :mod:`trimtab.examples.digits` (which imports torch) so that the launcher
can read them without loading torch.
"""

#: A progress line: this prefix, then JSON with ``step``, ``total`` and maybe ``loss``.
PROGRESS = "TRIMTAB_PROGRESS "
#: The result line: this prefix, then JSON with the job's results.
RESULT = "TRIMTAB_RESULT "
