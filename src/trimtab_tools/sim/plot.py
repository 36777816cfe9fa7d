"""Throughput against cluster size, each policy of each pair a line, as an SVG file
(written by hand: the plot needs no plotting library)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trimtab_tools.sim.scenarios import PAIRS

__all__ = ["throughput_plot"]

WIDTH, HEIGHT = 760, 420
LEFT, RIGHT, TOP, BOTTOM = 80, 210, 40, 60
COLOURS = ("#1f77b4", "#aec7e8", "#d62728", "#ff9896")


def _log_ticks(lo: float, hi: float) -> list[float]:
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    return [10.0**e for e in range(first, last + 1)]


def throughput_plot(points: Sequence[dict[str, Any]], path: str) -> None:
    """Write the sweep ``points`` (``trimtab simulate --sweep``'s) to ``path``: samples/s
    against workers, both axes logarithmic. Blocks to write; raises OSError."""
    lines: list[tuple[str, list[tuple[float, float]]]] = []
    for name, p in PAIRS.items():
        for policy in (p.policy, p.baseline):
            xy = [
                (float(pt["workers"]), float(pt[name][policy]["throughput_samples_per_s"]))
                for pt in points
            ]
            lines.append((f"{policy} ({p.scenario})", xy))
    xs = [x for _, xy in lines for x, _ in xy]
    ys = [y for _, xy in lines for _, y in xy]
    xt, yt = _log_ticks(min(xs), max(xs)), _log_ticks(min(ys), max(ys))
    lx = (math.log10(xt[0]), math.log10(xt[-1]) if xt[-1] > xt[0] else math.log10(xt[0]) + 1)
    ly = (math.log10(yt[0]), math.log10(yt[-1]) if yt[-1] > yt[0] else math.log10(yt[0]) + 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ratio = round(points[-1]["workers"] / points[-1]["servers"], 1)

    def px(x: float) -> float:
        return LEFT + plot_w * (math.log10(x) - lx[0]) / (lx[1] - lx[0])

    def py(y: float) -> float:
        return TOP + plot_h * (1 - (math.log10(y) - ly[0]) / (ly[1] - ly[0]))

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14">trimtab simulate: throughput against '
        f"cluster size (servers = workers / {ratio:g})</text>",
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
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" text-anchor="middle">workers</text>'
    )
    out.append(
        f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {TOP + plot_h / 2})">samples/s (simulated)</text>'
    )
    for i, (label, xy) in enumerate(lines):
        colour = COLOURS[i % len(COLOURS)]
        dash = ' stroke-dasharray="6 4"' if i % 2 else ""
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in xy)
        out.append(
            f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        for x, y in xy:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{colour}"/>')
        ly_ = TOP + 16 + 20 * i
        out.append(
            f'<line x1="{WIDTH - RIGHT + 12}" y1="{ly_}" x2="{WIDTH - RIGHT + 40}" '
            f'y2="{ly_}" stroke="{colour}" stroke-width="2"{dash}/>'
        )
        out.append(f'<text x="{WIDTH - RIGHT + 46}" y="{ly_ + 4}">{label}</text>')
    out.append("</svg>")
    Path(path).write_text("\n".join(out) + "\n")
