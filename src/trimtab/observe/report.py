"""``trimtab report RUN_DIR``: a run record (:mod:`.records`) as PNG plots and one
self-contained HTML page (the plots inlined, no other file needed).

:func:`series` turns the events into the plotted figures (pure, tested against the
events); :func:`render` draws them with matplotlib (``pip install 'trimtab[plot]'``).
"""

from __future__ import annotations

import base64
import collections
import html
import json
from pathlib import Path
from typing import Any

from trimtab.errors import ConfigError
from trimtab.observe.records import SUMMARY, read_events
from trimtab.roles.coordinator.events import Event

#: The plots, by file name: (title, y label).
PLOTS = {
    "step_time.png": ("Step time per worker", "seconds"),
    "throughput.png": ("Throughput", "samples / s"),
    "server_load.png": ("Per-server load", "MB / s moved"),
    "batch_sizes.png": ("Batch size per worker", "samples"),
    "placement.png": ("Placement: chunks per server", "chunks"),
}

#: Event kinds listed in the page's timeline (step and load reports are the plots').
TIMELINE = ("job", "placement", "migration", "straggler", "saps", "member", "servers_wanted",
            "failover", "checkpoint", "refused", "end")  # fmt: skip

_PLAIN = ("seq", "t", "kind", "owners")  # fields the timeline leaves out

Series = dict[str, list[tuple[float, float]]]


def series(events: list[Event]) -> dict[str, Series]:
    """The figures of each plot of :data:`PLOTS`, by file name: named lines of (x, y)
    points. Step time and batch size are per worker over its clock; throughput over
    seconds since the start (samples reported per one-second bin); server load over
    seconds (bytes per second between two load reports); placement over seconds (the
    chunks of each server in each published map). Pure."""
    t0 = events[0]["t"] if events else 0.0
    out: dict[str, Series] = {name: collections.defaultdict(list) for name in PLOTS}
    bins: collections.Counter[int] = collections.Counter()
    last_load: dict[int, tuple[float, float]] = {}
    for e in events:
        kind, t = e["kind"], e["t"] - t0
        if kind == "step":
            worker, clock = f"worker {e['rank']}", float(e["clock"])
            out["step_time.png"][worker].append((clock, e["compute_s"] + e["comm_s"]))
            out["batch_sizes.png"][worker].append((clock, float(e["batch"])))
            bins[int(t)] += int(e["batch"])
        elif kind == "load":
            server = int(e["server"])
            before = last_load.get(server)
            last_load[server] = (t, float(e["bytes"]))
            if before is not None and t > before[0] and e["bytes"] >= before[1]:
                rate = (float(e["bytes"]) - before[1]) / (t - before[0]) / 1e6
                out["server_load.png"][f"server {server}"].append((t, rate))
        elif kind == "placement":
            for s, chunks in enumerate(e["chunks"]):
                out["placement.png"][f"server {s}"].append((t, float(chunks)))
    if bins:
        first, last = min(bins), max(bins)
        out["throughput.png"]["samples / s"] = [
            (float(b), float(bins.get(b, 0))) for b in range(first, last + 1)
        ]
    return {name: dict(lines) for name, lines in out.items()}


def render(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write the plots of the run recorded in ``run_dir`` and ``report.html`` to
    ``out_dir`` (default ``run_dir``); return the files written. Blocks while it draws.
    Raises :class:`ConfigError` for a directory without a record, or without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "trimtab report draws with matplotlib: pip install 'trimtab[plot]'"
        ) from None
    events = read_events(run_dir)
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    migrations = [e["t"] - events[0]["t"] for e in events if e["kind"] == "migration"
                  and e["phase"] == "start"]  # fmt: skip
    written = []
    for name, lines in series(events).items():
        title, ylabel = PLOTS[name]
        fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
        for label, points in sorted(lines.items()):
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            if name == "placement.png":
                ax.step(xs, ys, where="post", label=label)
            else:
                ax.plot(xs, ys, label=label, marker="." if len(xs) < 50 else None)
        if name in ("server_load.png", "placement.png", "throughput.png"):
            for t in migrations:
                ax.axvline(t, color="grey", linestyle=":", linewidth=1)
        ax.set_title(title)
        ax.set_xlabel("step" if name in ("step_time.png", "batch_sizes.png") else "seconds")
        ax.set_ylabel(ylabel)
        if lines:
            ax.legend(fontsize="small", loc="best")
        else:
            ax.text(0.5, 0.5, "no data in this run", ha="center", transform=ax.transAxes)
        fig.tight_layout()
        fig.savefig(out_dir / name)
        plt.close(fig)
        written.append(out_dir / name)
    page = out_dir / "report.html"
    page.write_text(_page(run_dir, events, written))
    return [*written, page]


def _page(run_dir: Path, events: list[Event], plots: list[Path]) -> str:
    summary: dict[str, Any] = {}
    if (run_dir / SUMMARY).exists():
        summary = json.loads((run_dir / SUMMARY).read_text())
    job = next((e for e in events if e["kind"] == "job"), {})
    keep = ("duration_s", "steps", "samples", "mean_throughput", "epoch", "migrations",
            "bytes_moved", "counts", "stragglers", "ended")  # fmt: skip
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(json.dumps(summary[k]))}</td></tr>"
        for k in keep
        if k in summary
    )
    images = "".join(
        f'<img alt="{p.name}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}">'
        for p in plots
    )
    t0 = events[0]["t"] if events else 0.0
    timeline = "".join(
        f"<tr><td>{e['t'] - t0:.2f}</td><td>{html.escape(e['kind'])}</td><td>"
        + html.escape(", ".join(f"{k}={v}" for k, v in e.items() if k not in _PLAIN))
        + "</td></tr>"
        for e in events
        if e["kind"] in TIMELINE
    )
    title = html.escape(f"trimtab run {job.get('job', run_dir.name)}")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title><style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
img {{ display: block; margin: 1em 0; max-width: 100%; }}
table {{ border-collapse: collapse; font-size: 90%; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; vertical-align: top; }}
</style></head><body>
<h1>{title}</h1>
<p>{html.escape(json.dumps({k: v for k, v in job.items() if k not in ("seq", "t", "kind")}))}</p>
<h2>Summary</h2><table>{rows}</table>
<h2>Plots</h2>{images}
<h2>Timeline</h2><table><tr><th>s</th><th>event</th><th>what</th></tr>{timeline}</table>
</body></html>
"""
