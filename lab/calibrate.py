"""Calibrate the kernel model's costs from benchmark measurements, and check its predictions.

Fits KernelCost (c, r, signal latency, fixed overhead) to dashgen's measured backward times from
`dashgen bench` JSON files, on a subset of sequence lengths, then predicts the rest: how close
the times are, and whether the schedule the model ranks first is the one that measured fastest.
The report ends with the `dashgen plan --kernel-model` line that predicts with the fitted costs.

python3 lab/calibrate.py DIR/bench.json [--fit-seqlens 1024 2048] [--head-dims 64] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dashgen.caches import memo  # noqa: E402
from dashgen.codegen.variants import backward_tiles  # noqa: E402
from dashgen.schedule.builders import build_schedule  # noqa: E402
from dashgen.schedule.ir import Schedule  # noqa: E402
from dashgen.schedule.problem import Problem  # noqa: E402
from dashgen.tools.kernel_model import KernelCost, kernel_makespan  # noqa: E402

# r and the signal latency as fractions of c: the grid the fit searches.
R_RATIOS = (0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6)
LATENCY_RATIOS = (0.0, 0.02, 0.05, 0.1, 0.2)


@dataclass(frozen=True)
class Measurement:
    """One dashgen backward row of a benchmark: its problem, schedule, mode and median time."""

    batch: int
    heads: int
    seqlen: int
    head_dim: int
    mask: str
    schedule: str
    deterministic: bool
    num_workers: int
    ms: float

    @property
    def config(self) -> tuple[int, str, int]:
        return (self.head_dim, self.mask, self.seqlen)

    def problem(self) -> Problem:
        block_m, block_n = backward_tiles(self.head_dim)
        return Problem(batch=self.batch, heads_q=self.heads, seqlen_q=self.seqlen,
                       head_dim=self.head_dim, mask=self.mask, block_m=block_m, block_n=block_n)


def load_measurements(paths: list[Path]) -> list[Measurement]:
    """dashgen backward rows without errors from `dashgen bench` JSON files."""
    rows: list[Measurement] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if not isinstance(data, dict) or "rows" not in data or "meta" not in data:
            raise ValueError(f"{path}: not a `dashgen bench` result (needs 'meta' and 'rows')")
        workers = int(data["meta"]["sm_count"])
        for row in data["rows"]:
            if (row.get("impl") != "dashgen" or row.get("direction") != "backward"
                    or row.get("error") or row.get("ms") is None):
                continue
            rows.append(Measurement(row["batch"], row["heads"], row["seqlen"], row["head_dim"],
                                    row["mask"], row["schedule"], bool(row["deterministic"]),
                                    row.get("num_workers") or workers, float(row["ms"])))
    if not rows:
        raise ValueError("no dashgen backward measurements in " + ", ".join(map(str, paths)))
    return rows


@memo(max_entries=256)
def _schedule(problem: Problem, name: str, workers: int) -> Schedule:
    return build_schedule(name, problem, workers)


def unit_makespan(m: Measurement, r_ratio: float, latency_ratio: float) -> float:
    """The model's makespan for m with c = 1 and no overhead."""
    schedule = _schedule(m.problem(), m.schedule, m.num_workers)
    return kernel_makespan(schedule, KernelCost(1.0, r_ratio, latency_ratio), m.deterministic)


def _fit_scale(units: list[float], times: list[float]) -> tuple[float, float, float]:
    """(c, overhead, rms relative error) minimizing sum(((c*u + o) / t - 1)^2), o >= 0."""
    # Normal equations of the rows [u/t, 1/t] . [c, o] = 1.
    a11 = sum((u / t) ** 2 for u, t in zip(units, times))
    a12 = sum(u / t ** 2 for u, t in zip(units, times))
    a22 = sum(1 / t ** 2 for t in times)
    b1 = sum(u / t for u, t in zip(units, times))
    b2 = sum(1 / t for t in times)
    det = a11 * a22 - a12 * a12
    c, o = ((b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det) if det > 0 else (0.0, -1.0)
    if o < 0:  # a negative fixed cost has no meaning: fit the scale alone
        c, o = b1 / a11, 0.0
    err = math.sqrt(sum(((c * u + o) / t - 1) ** 2 for u, t in zip(units, times)) / len(times))
    return c, o, err


@dataclass(frozen=True)
class Fit:
    cost: KernelCost  # in milliseconds
    rms_error: float  # relative, on the measurements it was fitted to
    fitted_on: int


def fit(measurements: list[Measurement]) -> Fit:
    """Grid over r/c and latency/c; c and the overhead by least squares at each point."""
    times = [m.ms for m in measurements]
    best: Fit | None = None
    for r_ratio in R_RATIOS:
        for lat_ratio in LATENCY_RATIOS:
            units = [unit_makespan(m, r_ratio, lat_ratio) for m in measurements]
            c, overhead, err = _fit_scale(units, times)
            if best is None or err < best.rms_error:
                best = Fit(KernelCost(c, r_ratio * c, lat_ratio * c, overhead), err,
                           len(measurements))
    assert best is not None
    return best


def predict_ms(m: Measurement, cost: KernelCost) -> float:
    unit = replace(cost, c=1.0, r=cost.r / cost.c, signal_latency=cost.signal_latency / cost.c,
                   overhead=0.0)
    schedule = _schedule(m.problem(), m.schedule, m.num_workers)
    return cost.c * kernel_makespan(schedule, unit, m.deterministic) + cost.overhead


@dataclass(frozen=True)
class Ranking:
    """Deterministic schedules of one configuration: measured best against the model's pick."""

    config: tuple[int, str, int]
    measured_best: str
    predicted_best: str
    regret: float  # measured time of the predicted pick / measured best - 1


def rankings(measurements: list[Measurement], cost: KernelCost) -> list[Ranking]:
    by_config: dict[tuple, list[Measurement]] = {}
    for m in measurements:
        if m.deterministic:
            by_config.setdefault(m.config, []).append(m)
    out = []
    for config, rows in sorted(by_config.items()):
        measured = min(rows, key=lambda m: m.ms)
        predicted = min(rows, key=lambda m: predict_ms(m, cost))
        out.append(Ranking(config, measured.schedule, predicted.schedule,
                           predicted.ms / measured.ms - 1))
    return out


def plan_command(measurements: list[Measurement], cost: KernelCost) -> str:
    """The `dashgen plan` line that predicts with these costs (in us; the fitted overhead adds
    to every schedule alike, so it does not change which one wins)."""
    line = (f"dashgen plan --kernel-model --c {cost.c * 1e3:.3f} --r {cost.r * 1e3:.3f} "
            f"--signal-latency {cost.signal_latency * 1e3:.3f}")
    head_dims = {m.head_dim for m in measurements}
    if len(head_dims) == 1:
        problem = measurements[0].problem()
        line += (f" --hdim {problem.head_dim} --block-m {problem.block_m} "
                 f"--block-n {problem.block_n}")
    return (f"Predict with: `{line} ...` (the problem's other flags; costs in us, plus "
            f"{cost.overhead * 1e3:.1f} us of overhead for every schedule).")


def report(measurements: list[Measurement], fit_seqlens: tuple[int, ...]) -> str:
    """Fit on fit_seqlens, then the whole table and the ranking check, as markdown."""
    train = [m for m in measurements if m.seqlen in fit_seqlens]
    if not train:
        raise ValueError(f"no measurements at the fit seqlens {list(fit_seqlens)}")
    result = fit(train)
    c = result.cost
    lines = [f"Fitted on {result.fitted_on} measurements (seqlen {', '.join(map(str, fit_seqlens))}):"
             f" c = {c.c * 1e3:.3f} us/task, r = {c.r * 1e3:.3f} us, signal latency = "
             f"{c.signal_latency * 1e3:.3f} us, overhead = {c.overhead * 1e3:.1f} us; rms relative "
             f"error {result.rms_error:.1%}.", "", plan_command(measurements, c), "",
             "| head_dim | mask | seqlen | schedule | mode | measured ms | model ms | model/measured |",
             "|---|---|---|---|---|---|---|---|"]
    for m in sorted(measurements, key=lambda m: (m.config, m.schedule, not m.deterministic)):
        p = predict_ms(m, c)
        held_out = "" if m.seqlen in fit_seqlens else " (held out)"
        lines.append(f"| {m.head_dim} | {m.mask} | {m.seqlen}{held_out} | {m.schedule} | "
                     f"{'det' if m.deterministic else 'nondet'} | {m.ms:.3f} | {p:.3f} | "
                     f"{p / m.ms:.2f} |")
    lines += ["", "| head_dim | mask | seqlen | fastest measured | model's pick | regret |",
              "|---|---|---|---|---|---|"]
    for r in rankings(measurements, c):
        lines.append(f"| {r.config[0]} | {r.config[1]} | {r.config[2]} | {r.measured_best} | "
                     f"{r.predicted_best} | {r.regret:.1%} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="calibrate.py",
        description="Fit the kernel model's costs (c, r, signal latency, overhead) to dashgen's "
                    "measured backward times in `dashgen bench` JSON files at --fit-seqlens, then "
                    "compare its predictions with every measurement and check which schedule it "
                    "ranks first.")
    p.add_argument("files", nargs="+", metavar="BENCH.json")
    p.add_argument("--fit-seqlens", type=int, nargs="+", default=[1024, 2048],
                   help="sequence lengths to fit on; the rest are held out (default 1024 2048)")
    p.add_argument("--head-dims", type=int, nargs="+", default=None,
                   help="fit and check only these head_dims (default: every one in the files, "
                        "with one set of costs)")
    p.add_argument("--out", metavar="FILE.md", help="also write the report here")
    return p


def main(argv: list[str] | None = None) -> None:
    """The report on stdout (and in --out); a file that is no benchmark result, or no row left
    to fit, is one line on stderr and exit status 2."""
    args = build_parser().parse_args(argv)
    try:
        measurements = load_measurements([Path(f) for f in args.files])
        if args.head_dims:
            # One model per head_dim: a task's cost differs between them.
            measurements = [m for m in measurements if m.head_dim in args.head_dims]
            if not measurements:
                raise ValueError(f"no dashgen backward rows with head_dim in {args.head_dims}")
        text = report(measurements, tuple(args.fit_seqlens))
    except (OSError, ValueError, KeyError) as exc:
        print(f"calibrate.py: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
