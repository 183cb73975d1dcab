"""The benchmark's report: the markdown tables (every row per configuration, the published
anchors beside them, the backward's extra memory against its floor, then the targets from
bench_summary) and the plot, all from the rows bench.json holds."""
from __future__ import annotations

import math
from pathlib import Path

from . import bench_summary

# Backward TFLOP/s measured on one H200 by the same protocol (FA3 with its deterministic mode;
# DASH = the paper authors' fork). Copied from ANCHORS.md, section "Measured on one H200".
PUBLISHED_ANCHORS = {  # published anchors, ANCHORS.md 2026-11-30
    (64, "full"): {
        "FA3_det": {1024: 316.0, 2048: 351.4, 4096: 389.2, 8192: 441.9, 16384: 506.6},
        "DASH_det": {1024: 395.2, 2048: 471.0, 4096: 482.7, 8192: 504.1, 16384: 514.5},
    },
    (64, "causal"): {
        "FA3_det": {1024: 245.4, 2048: 332.9, 4096: 371.2, 8192: 407.8, 16384: 443.2},
        "DASH_det": {1024: 281.3, 2048: 366.4, 4096: 353.1, 8192: 441.0, 16384: 466.0},
    },
    (128, "full"): {
        "FA3_det": {1024: 379.1, 2048: 403.8, 4096: 474.3, 8192: 526.6, 16384: 572.6},
        "DASH_det": {1024: 417.4, 2048: 489.8, 4096: 525.9, 8192: 550.6, 16384: 538.3},
    },
    (128, "causal"): {
        "FA3_det": {1024: 259.4, 2048: 355.7, 4096: 406.9, 8192: 459.8, 16384: 489.7},
        "DASH_det": {1024: 277.4, 2048: 360.0, 4096: 403.9, 8192: 455.2, 16384: 494.0},
    },
}


def seq_label(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def _timing_note(meta: dict) -> str:
    """How the rows of a configuration shared the GPU; older runs carry no note or `interleaved`."""
    if meta.get("rounds"):
        reverse = ", every second round in reverse" if meta.get("round_order") else ""
        return (f", in {meta['rounds']} rounds over the rows of a configuration{reverse} (each "
                f"row's calls back to back after its warm-ups)")
    if meta.get("interleaved"):
        return ", the rows of a configuration timed round-robin"
    return ""


def render_markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# dashgen benchmark: {meta['gpu']}, {meta['date']}", "",
             f"torch {meta['torch']}, CUDA {meta['torch_cuda']}, NVRTC {meta['nvrtc']}, "
             f"commit {meta['commit']}; {meta['tokens']} tokens, hidden {meta['hidden']}, bf16; "
             f"median of {meta['repeats']} after {meta['warmup']} warm-ups"
             f"{' and ' + format(meta['warmup_ms'], 'g') + ' ms' if meta.get('warmup_ms') else ''}"
             f"{_timing_note(meta)}"
             f". Backward TFLOP/s "
             f"(forward row: forward TFLOP/s); anchors from ANCHORS.md (2026-11-30, not re-run).",
             ""]
    sections = sorted({(r["head_dim"], r["mask"]) for r in rows},
                      key=lambda s: (s[0], s[1] != "full"))
    for head_dim, mask in sections:
        part = [r for r in rows if r["head_dim"] == head_dim and r["mask"] == mask]
        seqlens = sorted({r["seqlen"] for r in part})
        labels = list(dict.fromkeys(r["label"] for r in part))
        lines += [f"## head_dim {head_dim}, {mask}", "",
                  "| impl | " + " | ".join(seq_label(s) for s in seqlens) + " |",
                  "|---|" + "---|" * len(seqlens)]
        cell = {(r["label"], r["seqlen"]): r for r in part}
        for label in labels:
            lines.append(f"| {label} | " + " | ".join(
                _cell(cell.get((label, s))) for s in seqlens) + " |")
        for name, figures in PUBLISHED_ANCHORS.get((head_dim, mask), {}).items():
            lines.append(f"| {name} (anchor) | " + " | ".join(
                f"{figures[s]:.1f}" if s in figures else "-" for s in seqlens) + " |")
        lines += ["", "Backward extra memory (MiB, beyond dq/dk/dv):", "",
                  "| impl | " + " | ".join(seq_label(s) for s in seqlens) + " |",
                  "|---|" + "---|" * len(seqlens)]
        for label in labels:
            if any(r["direction"] == "backward" for r in part if r["label"] == label):
                lines.append(f"| {label} | " + " | ".join(
                    _mib(cell.get((label, s)), "extra_bytes") for s in seqlens) + " |")
        floor = {r["seqlen"]: r for r in part}
        lines.append("| floor b*h*s*(4d+8) | " + " | ".join(
            _mib(floor.get(s), "floor_bytes") for s in seqlens) + " |")
        lines.append("")
    lines.append(bench_summary.render(bench_summary.summarize(rows, PUBLISHED_ANCHORS), rows))
    errors = [r for r in rows if r.get("error")]
    if errors:
        lines += ["## Rows that did not run", ""]
        lines += [f"- {r['label']}, head_dim {r['head_dim']}, {r['mask']}, "
                  f"{seq_label(r['seqlen'])}: {r['error']}" for r in errors]
        lines.append("")
    return "\n".join(lines)


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("error"):
        return "n/a" if row["error"].startswith("n/a") else "error"
    return f"{row['tflops']:.1f}"


def _mib(row: dict | None, key: str) -> str:
    if row is None or row.get(key) is None:
        return "-"
    return f"{row[key] / 2**20:.1f}"


def plot(rows: list[dict], path: Path) -> str | None:
    """One panel per (head_dim, mask); None when written, else why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        return f"no plot: {exc}"
    sections = sorted({(r["head_dim"], r["mask"]) for r in rows},
                      key=lambda s: (s[0], s[1] != "full"))
    if not sections:
        return "no plot: no rows"
    cols = 2
    nrows = math.ceil(len(sections) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.5 * nrows), squeeze=False)
    for ax, (head_dim, mask) in zip(axes.flat, sections):
        part = [r for r in rows if r["head_dim"] == head_dim and r["mask"] == mask
                and r["direction"] == "backward" and r.get("tflops")]
        for label in dict.fromkeys(r["label"] for r in part):
            pts = sorted((r["seqlen"], r["tflops"]) for r in part if r["label"] == label)
            style = "-" if label.startswith("dashgen_det") else \
                "--" if label.startswith("dashgen") else ":"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", ms=3,
                    label=label)
        for (name, figures), marker in zip(PUBLISHED_ANCHORS.get((head_dim, mask), {}).items(),
                                           ("x", "+")):
            xs = sorted(figures)
            ax.plot(xs, [figures[s] for s in xs], linestyle="none", marker=marker, color="black",
                    label=f"{name} (anchor)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"head_dim {head_dim}, {mask}")
        ax.set_xlabel("seqlen")
        ax.set_ylabel("backward TFLOP/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(sections):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return None


