"""Gantt charts of simulated schedules: a PNG (matplotlib, optional) and a terminal sketch."""
from __future__ import annotations

import math

from .simulate import SimResult


def _summary(result: SimResult) -> str:
    return (f"makespan {result.makespan:.4g}, lower bound {result.lower_bound:.4g} "
            f"({100 * result.efficiency:.1f}% efficient)")


def draw_gantt(results: list[tuple[str, SimResult]], path: str, title: str) -> None:
    """One subplot per schedule, y = worker; compute colored by head, reductions darker."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.collections import PolyCollection
        from matplotlib.colors import to_rgba
        from matplotlib.patches import Patch
    except ImportError:
        raise RuntimeError("dashgen plan --png needs matplotlib: pip install 'dashgen[plot]'") from None
    if not results:
        raise ValueError("draw_gantt needs at least one (name, SimResult)")

    cmap = matplotlib.colormaps["tab20"]
    max_workers = max(r.num_workers for _, r in results)
    # Thin bars for 132 workers; the height grows with the worker count up to a readable cap.
    row_height = min(6.0, 1.2 + 0.035 * max_workers)
    fig, axes = plt.subplots(len(results), 1, sharex=True, squeeze=False,
                             figsize=(14, 0.6 + row_height * len(results)))
    for ax, (name, result) in zip(axes[:, 0], results):
        # PolyCollection instead of barh: one artist for 100k+ bars keeps rendering fast.
        polys, colors = [], []

        def bar(worker: int, start: float, end: float, rgba: tuple) -> None:
            if end > start:
                y0, y1 = worker - 0.4, worker + 0.4
                polys.append(((start, y0), (end, y0), (end, y1), (start, y1)))
                colors.append(rgba)

        for e in result.events:
            base = to_rgba(cmap(e.task.head % cmap.N))
            dark = (base[0] * 0.55, base[1] * 0.55, base[2] * 0.55, 1.0)
            bar(e.worker, e.compute_start, e.compute_end, base)
            bar(e.worker, e.reduce_start, e.reduce_end, dark)
            if e.dkv_start is not None:
                bar(e.worker, e.dkv_start, e.dkv_end, (0.1, 0.1, 0.1, 1.0))
        ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors="none"))
        ax.set_ylim(result.num_workers - 0.5, -0.5)  # worker 0 on top
        ax.set_ylabel("worker")
        ax.set_title(f"{name}: {_summary(result)}", fontsize=10, loc="left")
        ax.axvline(result.lower_bound, color="red", linewidth=0.8, linestyle="--")
    end = max(r.makespan for _, r in results)
    axes[-1, 0].set_xlim(0, end * 1.01 if end > 0 else 1)
    axes[-1, 0].set_xlabel("time (cost units)")
    axes[0, 0].legend(handles=[
        Patch(color=cmap(0), label="compute (color = head)"),
        Patch(color=tuple(v * 0.55 for v in to_rgba(cmap(0))[:3]), label="dQ reduction"),
        Patch(color=(0.1, 0.1, 0.1), label="dK/dV add (GQA)"),
        Patch(facecolor="white", edgecolor="grey", label="waiting / idle"),
    ], loc="upper right", fontsize=7, ncol=4)
    fig.suptitle(title)
    # Leave the top strip to the figure title so it does not run into the first subplot's.
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def text_gantt(result: SimResult, width: int = 80, max_workers: int = 16) -> str:
    """One line per worker: '#' compute, '=' dQ/dK/dV reduction, '.' waiting or idle.

    Each column shows whichever state filled most of its time slice.
    """
    if width < 1:
        raise ValueError(f"width must be positive, got {width}")
    lines = [_summary(result)]
    shown = min(result.num_workers, max_workers)
    span = result.makespan if result.makespan > 0 else 1.0
    scale = width / span
    # filled[w][state][col] = time of that state inside the column; state 0 compute, 1 reduce.
    filled = [[[0.0] * width for _ in range(2)] for _ in range(shown)]

    def add(worker: int, state: int, start: float, end: float) -> None:
        a, b = start * scale, end * scale
        row = filled[worker][state]
        for col in range(max(0, int(a)), min(width, math.ceil(b))):
            row[col] += min(b, col + 1) - max(a, col)

    for e in result.events:
        if e.worker < shown:
            add(e.worker, 0, e.compute_start, e.compute_end)
            add(e.worker, 1, e.reduce_start, e.reduce_end)
            if e.dkv_start is not None:
                add(e.worker, 1, e.dkv_start, e.dkv_end)
    for w in range(shown):
        chars = []
        for col in range(width):
            comp, red = filled[w][0][col], filled[w][1][col]
            idle = 1.0 - comp - red
            chars.append("#" if comp >= red and comp >= idle else "=" if red >= idle else ".")
        lines.append(f"w{w:<4}|{''.join(chars)}|")
    if result.num_workers > shown:
        lines.append(f"... {result.num_workers - shown} more workers")
    return "\n".join(lines)
