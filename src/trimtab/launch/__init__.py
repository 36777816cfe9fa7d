"""Starting a job: what it is (``spec``: :class:`~trimtab.launch.spec.LaunchConfig`
composed of :mod:`trimtab.settings`), the local launcher (``job``: ``trimtab run``),
the built-in training example (``train``), the environment variables every edge reads
or sets (``env``), asking a running job's coordinator (``control``), and the cores
this machine lends (``cores``). Imports no torch: the launcher's process does without.
"""
