"""The result lines the experiments' worker scripts print for their drivers to read.

Apart from the worker scripts (which import torch) so that ``trimtab experiment``'s
driver and its flags load without torch.
"""

#: ``_stragglers_worker``'s and ``_ddp_worker``'s result line: this, then JSON.
STRAGGLERS_RESULT = "TRIMTAB_EXPERIMENT "
#: ``_psld_worker``'s result line: this, then JSON.
PSLD_RESULT = "TRIMTAB_PSLD "
