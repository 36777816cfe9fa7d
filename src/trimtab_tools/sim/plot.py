"""The simulator's plots, as SVG files written by hand (no plotting library needed):
throughput against cluster size for each policy of each pair (``--sweep --plot``),
and each run's step times, as ``trimtab experiment psld --plot`` draws a real run's
(``--plot-steps``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trimtab_tools.sim.scenarios import PAIRS

__all__ = ["step_plot", "throughput_plot"]

WIDTH, HEIGHT = 820, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 260, 40, 60
COLOURS = ("#1f77b4", "#aec7e8", "#d62728", "#ff9896", "#2ca02c", "#98df8a")

Line = tuple[str, list[tuple[float, float]]]


def _log_ticks(lo: float, hi: float) -> list[float]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**e for e in range(first, max(last, first + 1) + 1)]


def _linear_ticks(lo: float, hi: float) -> list[float]:
    step = 10 ** math.floor(math.log10(max(hi - lo, 1.0)))
    while (hi - lo) / step < 4:
        step /= 2
    return [lo + i * step for i in range(int((hi - lo) // step) + 1)]


def _chart(lines: Sequence[Line], title: str, xlabel: str, ylabel: str, *, logx: bool) -> str:
    """An SVG line chart of ``lines`` (label, points): y logarithmic, x too if
    ``logx``. Pure."""
    xs = [x for _, xy in lines for x, _ in xy]
    ys = [y for _, xy in lines for _, y in xy if y > 0]
    xt = _log_ticks(min(xs), max(xs)) if logx else _linear_ticks(min(xs), max(xs))
    yt = _log_ticks(min(ys), max(ys))
    fx = math.log10 if logx else float
    right = fx(xt[-1]) if logx else max(xs)  # a linear axis ends at the last point
    lx, ly = (fx(xt[0]), right), (math.log10(yt[0]), math.log10(yt[-1]))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + plot_w * (fx(x) - lx[0]) / ((lx[1] - lx[0]) or 1.0)

    def py(y: float) -> float:
        return TOP + plot_h * (1 - (math.log10(max(y, yt[0])) - ly[0]) / (ly[1] - ly[0]))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">{title}</text>',
    ]
    for x in xt:
        out.append(
            f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{TOP + plot_h}" '
            'stroke="#ddd"/>'
        )
        out.append(
            f'<text x="{px(x):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">{x:g}</text>'
        )
    for y in yt:
        out.append(
            f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + plot_w}" y2="{py(y):.1f}" '
            'stroke="#ddd"/>'
        )
        out.append(f'<text x="{LEFT - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
    out.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" text-anchor="middle">{xlabel}</text>'
    )
    out.append(
        f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {TOP + plot_h / 2})">{ylabel}</text>'
    )
    dots = all(len(xy) <= 20 for _, xy in lines)
    for i, (label, xy) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6 4"' if i % 2 else ""
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in xy)
        out.append(
            f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        if dots:
            out += [
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>' for x, y in xy
            ]
        at = TOP + 16 + 20 * i
        out.append(
            f'<line x1="{WIDTH - RIGHT + 12}" y1="{at}" x2="{WIDTH - RIGHT + 40}" '
            f'y2="{at}" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{WIDTH - RIGHT + 46}" y="{at + 4}">{label}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def throughput_plot(points: Sequence[dict[str, Any]], path: str) -> None:
    """Write the sweep ``points`` (``trimtab simulate --sweep``'s) to ``path``: samples/s
    against workers, both axes logarithmic. Blocks to write; raises OSError."""
    lines: list[Line] = []
    for name, p in PAIRS.items():
        for policy in (p.policy, p.baseline):
            xy = [
                (float(pt["workers"]), float(pt[name][policy]["throughput_samples_per_s"]))
                for pt in points
            ]
            lines.append((f"{policy} ({p.scenario})", xy))
    ratio = round(points[-1]["workers"] / points[-1]["servers"], 1)
    title = f"trimtab simulate: throughput against cluster size (servers = workers / {ratio:g})"
    svg = _chart(lines, title, "workers", "samples/s (simulated)", logx=True)
    Path(path).write_text(svg)


def step_plot(runs: dict[str, dict[str, Any]], path: str, title: str) -> None:
    """Write each run's worker-0 step times (``runs``: label -> a run's figures, with
    ``step_times``) to ``path`` against the step, the time axis logarithmic, as the
    psld experiment's plot. Blocks to write; raises OSError."""
    lines: list[Line] = [
        (
            f"{label}: {r['steps_per_s']:.2f} steps/s",
            [(float(i), float(t)) for i, t in enumerate(r["step_times"])],
        )
        for label, r in runs.items()
    ]
    svg = _chart(lines, title, "step", "step time (s, worker 0, simulated)", logx=False)
    Path(path).write_text(svg)
