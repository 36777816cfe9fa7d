"""The small training script the observe tests run as a job's workers (a 2-layer model,
SGD through DistributedOptimizer), pausing ``pause_s`` after each step so that the job
lasts long enough for what the test watches."""

from __future__ import annotations

import textwrap


def training_script(pause_s: float) -> str:
    """The script's source; it takes its steps as its first argument and prints
    ``trained`` at its end."""
    return textwrap.dedent(f"""
        import sys, time, torch, trimtab
        trimtab.init()
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
        opt = trimtab.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                           model.named_parameters())
        for step in range(int(sys.argv[1])):
            model(torch.ones(8, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            time.sleep({pause_s!r})
        print("trained", flush=True)
    """)
