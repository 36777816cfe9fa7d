"""Starting a job: the local launcher (``trimtab run``) and the built-in training example."""
