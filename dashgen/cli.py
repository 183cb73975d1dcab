"""The `dashgen` command line: list, show, plan and verify schedules; emit their kernels."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .ir import Schedule, ScheduleFormatError
from .problem import Mask, Problem
from .schedules import BUILDERS, UnsupportedProblem, build_schedule, list_schedules

DEFAULT_WORKERS = 132  # SMs of an H100 SXM / H200; pass --workers for anything else


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def _problem_options(parser: argparse.ArgumentParser, helps: dict[str, str] | None = None) -> None:
    """Add the shared problem options; `helps` replaces the help text of an option, by dest."""
    helps = helps or {}
    g = parser.add_argument_group("problem")
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--heads", type=int, default=1, help="query heads (default 1)")
    g.add_argument("--heads-kv", type=int, default=None, help="KV heads for GQA/MQA (default: --heads)")
    g.add_argument("--seqlen", type=int, default=4096, help="seqlen_q and seqlen_k (default 4096)")
    g.add_argument("--seqlen-q", type=int, default=None, help="overrides --seqlen for queries")
    g.add_argument("--seqlen-k", type=int, default=None, help="overrides --seqlen for keys")
    g.add_argument("--hdim", type=int, default=128, help="head_dim (default 128)")
    g.add_argument("--mask", default="full",
                   help=helps.get("mask", "full, causal or window:LEFT,RIGHT (default full)"))
    g.add_argument("--block-m", type=int, default=128, help=helps.get("block_m"))
    g.add_argument("--block-n", type=int, default=128, help=helps.get("block_n"))
    g.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                   help=f"persistent workers, one per SM (default {DEFAULT_WORKERS})")


def _problem(args: argparse.Namespace) -> Problem:
    try:
        return Problem(batch=args.batch, heads_q=args.heads, heads_kv=args.heads_kv,
                       seqlen_q=args.seqlen_q or args.seqlen, seqlen_k=args.seqlen_k or args.seqlen,
                       head_dim=args.hdim, mask=Mask.parse(args.mask),
                       block_m=args.block_m, block_n=args.block_n)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _build(name: str, problem: Problem, workers: int) -> Schedule:
    try:
        return build_schedule(name, problem, workers)
    except ValueError as exc:  # UnsupportedProblem, unknown name, bad worker count
        raise CliError(str(exc)) from None


def cmd_schedules(args: argparse.Namespace) -> None:
    width = max(len(n) for n in BUILDERS)
    for name, builder in BUILDERS.items():
        dep = " [order depends on the worker count]" if builder.depends_on_workers else ""
        print(f"{name:<{width}}  {builder.summary}{dep}")


def cmd_show(args: argparse.Namespace) -> None:
    from .show import format_schedule

    schedule = _build(args.schedule, _problem(args), args.workers)
    print(format_schedule(schedule))
    if args.json:
        Path(args.json).write_text(schedule.to_json())


def cmd_plan(args: argparse.Namespace) -> None:
    from .simulate import Cost, simulate
    from .verify import verify

    problem = _problem(args)
    names = list_schedules() if args.schedule == "all" else [args.schedule]
    try:
        cost = (Cost.masked(args.c, args.r, args.signal_latency) if args.masked_cost
                else Cost(c=args.c, r=args.r, signal_latency=args.signal_latency))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"plan: {problem.describe()}; {args.workers} workers; "
          f"cost c={args.c:g} r={args.r:g} signal_latency={args.signal_latency:g}"
          + (" (c scaled by the kept fraction of each tile)" if args.masked_cost else ""))
    header = f"{'schedule':<16} {'makespan':>10} {'lower bound':>12} {'efficiency':>11} {'conflicts':>10}"
    print(header + (f" {'kernel model':>13}" if args.kernel_model else ""))
    results = []
    for name in names:
        try:
            schedule = build_schedule(name, problem, args.workers)
        except UnsupportedProblem as exc:
            print(f"{name:<16} skipped: {exc.reason}")
            continue
        except ValueError as exc:
            raise CliError(str(exc)) from None
        report = verify(schedule)
        result = simulate(schedule, cost)
        results.append((name, result))
        row = (f"{name:<16} {result.makespan:>10.2f} {result.lower_bound:>12.2f} "
               f"{result.efficiency:>10.1%} {report.num_conflicts:>10}")
        if args.kernel_model:
            row += f" {_kernel_model_makespan(schedule, args):>13}"
        print(row)
    if args.text:
        from .gantt import text_gantt

        for name, result in results:
            print(f"\n{name}:\n{text_gantt(result)}")
    if args.png and results:
        from .gantt import draw_gantt

        try:
            draw_gantt(results, args.png, title=f"dashgen plan: {problem.describe()}; "
                                                 f"{args.workers} workers")
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
        print(f"wrote {args.png}")


def _kernel_model_makespan(schedule: Schedule, args: argparse.Namespace) -> str:
    from .kernel_model import KernelCost, kernel_makespan

    if schedule.problem.gqa:
        return "n/a (GQA)"
    cost = KernelCost(c=args.c, r=args.r, signal_latency=args.signal_latency)
    return f"{kernel_makespan(schedule, cost):.2f}"


def cmd_verify(args: argparse.Namespace) -> None:
    from .verify import VerificationError, verify

    try:
        schedule = Schedule.from_json(Path(args.file).read_text())
    except OSError as exc:
        raise CliError(f"cannot read {args.file}: {exc.strerror}") from None
    except ScheduleFormatError as exc:
        raise CliError(f"{args.file}: {exc}") from None
    try:
        report = verify(schedule)
    except VerificationError as exc:
        print(f"{args.file}: INVALID\n{exc}")
        raise SystemExit(1) from None
    print(f"{args.file}: OK: schedule {schedule.name!r}, {report.num_tasks} tasks on "
          f"{report.num_workers} workers, {report.num_conflicts} order conflicts (Lemma 1)")


def _emit_problem(args: argparse.Namespace) -> Problem:
    """The problem of `dashgen emit`: the schedule's own mask by default, and the tiles of the
    backward kernel that serves the configuration (dashgen.kernels.backward_blocks)."""
    from .emit import default_mask, tile_error
    from .kernels import backward_blocks

    if args.mask is None:
        args.mask = default_mask(args.schedule)
    if args.gqa:
        if args.heads_kv is None:
            args.heads_kv = 1  # --gqa alone: every query head shares one KV head (MQA)
        if args.heads_kv >= args.heads:
            raise CliError(f"--gqa needs fewer KV heads than query heads, got --heads {args.heads} "
                           f"and --heads-kv {args.heads_kv} (try --heads 4 --heads-kv 1)")
    gqa = args.heads_kv is not None and args.heads_kv != args.heads
    hopper = args.kernel == "hopper"
    block_m, block_n = backward_blocks(args.dtype, args.hdim, gqa, hopper)
    args.block_m = block_m if args.block_m is None else args.block_m
    args.block_n = block_n if args.block_n is None else args.block_n
    for flag, value in (("--block-m", args.block_m), ("--block-n", args.block_n)):
        message = tile_error(flag, value, args.dtype, args.hdim, gqa, hopper)
        if message is not None:
            raise CliError(message)
    return _problem(args)


def cmd_emit(args: argparse.Namespace) -> None:
    from .compile import CompileError
    from .emit import GOLDEN_DIR, check_kernel_problem, emit, report_lines, write_golden
    from .verify import VerificationError

    if args.golden:
        directory = Path(args.out) if args.out else GOLDEN_DIR
        written, removed = write_golden(directory)
        print(f"wrote {len(written)} golden files to {directory}"
              + (f"; removed stale {', '.join(removed)}" if removed else ""))
        return
    if args.schedule is None:
        raise CliError("--schedule is required (or --golden to rewrite generated/)")
    problem = _emit_problem(args)
    try:
        check_kernel_problem(problem, args.dtype, args.kernel == "hopper")
    except ValueError as exc:
        raise CliError(str(exc)) from None
    schedule = _build(args.schedule, problem, args.workers)
    out = Path(args.out or "dashgen-out")
    mode = "non-deterministic" if args.nondeterministic else "deterministic"
    print(f"emit {schedule.name}: {problem.describe()}; {args.workers} workers; "
          f"{args.dtype}, {mode}{', GQA' if problem.gqa else ''}, {args.kernel} kernels")
    try:
        emission = emit(schedule, out, dtype=args.dtype, deterministic=not args.nondeterministic,
                        hopper=args.kernel == "hopper")
    except VerificationError as exc:
        print(f"dashgen emit: schedule failed verification:\n{exc}", file=sys.stderr)
        raise SystemExit(1) from None
    except CompileError as exc:
        print(f"dashgen emit: error: {exc}\n(the source is in {out}/{exc.source}.cu)",
              file=sys.stderr)
        raise SystemExit(1) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    print(f"wrote {emission.tasks_path} ({emission.plan.num_tasks} tasks)")
    for kernel in emission.kernels:
        print(f"wrote {kernel.source_path} and {kernel.cubin_path}")
    for line in report_lines(emission.kernels):
        print(line)


def cmd_calibrate(args: argparse.Namespace) -> None:
    from .calibrate import load_measurements, report

    try:
        measurements = load_measurements([Path(f) for f in args.files])
        if args.head_dims:
            # One model per head_dim: a task's cost differs between them.
            measurements = [m for m in measurements if m.head_dim in args.head_dims]
            if not measurements:
                raise ValueError(f"no dashgen backward rows with head_dim in {args.head_dims}")
        text = report(measurements, tuple(args.fit_seqlens))
    except (OSError, ValueError, KeyError) as exc:
        raise CliError(str(exc)) from None
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import run
    try:
        status = run(args)
    except SystemExit as exc:  # the benchmark's own refusals: bad options, no GPU
        if isinstance(exc.code, str):
            raise CliError(exc.code) from None
        raise
    if status:
        raise SystemExit(status)


def build_parser() -> argparse.ArgumentParser:
    from .kernels import BLOCK_M, BLOCK_N, Sm90BwdConfig

    parser = argparse.ArgumentParser(
        prog="dashgen", description="Deterministic attention backward schedules for Hopper.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("schedules", help="list the schedule builders",
                       description="List the schedule builders, one line each.")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("show", help="print a schedule's worker programs and dQ order",
                       description="Build a schedule and print each worker's program and the "
                                   "order in which every dQ tile is summed.")
    p.add_argument("--schedule", required=True, choices=list_schedules())
    p.add_argument("--json", metavar="FILE", help="also write the schedule as an editable JSON file")
    _problem_options(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("plan", help="simulate schedules and compare makespans",
                       description="Simulate schedules on a problem: makespan against the lower "
                                   "bound (total work / workers), with an optional Gantt chart.")
    p.add_argument("--schedule", default="all", choices=list_schedules() + ["all"])
    p.add_argument("--png", metavar="FILE", help="write a Gantt chart (needs matplotlib)")
    p.add_argument("--text", action="store_true", help="print a text Gantt chart per schedule")
    p.add_argument("--c", type=float, default=1.0, help="compute cost of one task (default 1)")
    p.add_argument("--r", type=float, default=0.2, help="cost of one dQ reduction (default 0.2)")
    p.add_argument("--signal-latency", type=float, default=0.05,
                   help="delay of a counter release seen by another worker (default 0.05)")
    p.add_argument("--kernel-model", action="store_true",
                   help="also give the makespan in the model of the kernel as built (a writer "
                        "warp adds dQ while the MMA goes on, 2 buffers; see dashgen calibrate)")
    p.add_argument("--masked-cost", action="store_true",
                   help="scale c by the fraction of each tile the mask keeps")
    _problem_options(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("verify", help="verify a schedule JSON file",
                       description="Check a schedule file against coverage, contiguity, total "
                                   "order and liveness; report order conflicts.")
    p.add_argument("file", metavar="FILE.json")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("emit", help="write a schedule's kernel sources, task table and cubins",
                       description="Build and verify a schedule, then write the forward and "
                                   "backward kernel sources (<kernel>.cu), the task table the "
                                   "backward kernel walks (<schedule>_<problem>.tasks.json) and "
                                   "the cubins (compiled for sm_90a with NVRTC, through the "
                                   "cache; no GPU needed), and print ptxas's figures per kernel "
                                   "function. The kernel sources do not depend on the schedule.")
    p.add_argument("--schedule", choices=list_schedules(), help="the schedule to emit")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                   help="element type of q, k, v (default bf16)")
    p.add_argument("--kernel", choices=["hopper", "mma"], default="hopper",
                   help="hopper: the TMA + wgmma kernels dashgen.attention runs (default); mma: "
                        "the portable mma.sync kernels (runtime kernel='mma')")
    p.add_argument("--out", metavar="DIR",
                   help="output folder (default ./dashgen-out; with --golden: generated/)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="the backward without ordered dQ adds (to measure what order costs)")
    p.add_argument("--gqa", action="store_true",
                   help="GQA/MQA: dK/dV summed over the query heads of a KV head in dkv_rank "
                        "order; needs --heads > --heads-kv (default --heads-kv 1). A problem "
                        "with fewer KV heads gets the GQA kernel anyway")
    p.add_argument("--golden", action="store_true",
                   help="rewrite the golden renders in generated/ (the other options are ignored)")
    _problem_options(p, helps={
        "mask": "full or causal (default: the mask the schedule serves: causal for "
                "symmetric_shift, full otherwise)",
        "block_m": "must be the tile of the backward kernel that serves the configuration "
                   "(default): for the Hopper backward "
                   f"{Sm90BwdConfig.blocks_for(64)[0]} at head_dim 64 and "
                   f"{Sm90BwdConfig.blocks_for(128)[0]} at 128, {BLOCK_M} for the mma.sync "
                   "backward (--kernel mma)",
        "block_n": f"likewise: {Sm90BwdConfig.block_n} for the Hopper backward, {BLOCK_N} "
                   "for the mma.sync one",
    })
    # The tiles are the serving backward's (filled in once dtype, head_dim and GQA are known),
    # and the schedule's own mask beats the shared "full".
    p.set_defaults(func=cmd_emit, mask=None, block_m=None, block_n=None)
    from . import bench
    p = sub.add_parser("bench", help="benchmark the kernels against PyTorch's (needs an sm_90 GPU)",
                       description=bench.__doc__.splitlines()[0] + " " + " ".join(
                           bench.__doc__.splitlines()[1:2]))
    bench.add_options(p)
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("calibrate", help="fit the kernel model to benchmark results",
                       description="Fit the kernel model's costs (c, r, signal latency, overhead) "
                                   "to dashgen's measured backward times in `dashgen bench` JSON "
                                   "files at --fit-seqlens, then compare its predictions with every "
                                   "measurement and check which schedule it ranks first.")
    p.add_argument("files", nargs="+", metavar="BENCH.json")
    p.add_argument("--fit-seqlens", type=int, nargs="+", default=[1024, 2048],
                   help="sequence lengths to fit on; the rest are held out (default 1024 2048)")
    p.add_argument("--head-dims", type=int, nargs="+", default=None,
                   help="fit and check only these head_dims (default: every one in the files, "
                        "with one set of costs)")
    p.add_argument("--out", metavar="FILE.md", help="also write the report here")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CliError as exc:
        print(f"dashgen {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
