"""The `dashgen` command line: list, show, plan and verify schedules; emit their kernels."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

from .version import __version__
from .codegen.variants import HEAD_DIMS, backward_tiles, runs_swapped
from .runtime.select import DEFAULT_SM_COUNT
from .schedule.builders import (BUILDERS, UnsupportedProblem, build_schedule, list_schedules,
                                min_workers)
from .schedule.ir import Schedule, ScheduleFormatError
from .schedule.problem import Mask, Problem
from .schedule.summary import ScheduleSummary, problem_tasks, summarize

# The full per-task views (show's worker programs and dQ orders, --json; plan's simulation,
# --text, --png, --kernel-model) hold every task as a Python object, several times over: past
# this many tasks they would take minutes and gigabytes, so they are refused.
FULL_VIEW_MAX_TASKS = 2_000_000
# Without --full or --summary: the full view up to this many tasks, where it still reads (and
# simulates) in seconds, the summary above.
FULL_VIEW_DEFAULT_TASKS = 20_000


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit status 2): the error and where the usage is,
    not the usage itself; the subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    g.add_argument("--seqlens", type=_lengths, default=None, metavar="L,L,...",
                   help="a pack: the sequences' lengths, comma-separated (0 allowed); replaces "
                        "--batch and --seqlen")
    g.add_argument("--seqlens-k", type=_lengths, default=None, metavar="L,L,...",
                   help="the pack's key lengths, if they differ from --seqlens")
    g.add_argument("--hdim", type=int, default=128, help="head_dim (default 128)")
    g.add_argument("--mask", default="full",
                   help=helps.get("mask", "full, causal or window:LEFT,RIGHT (default full)"))
    tiles = ", ".join(f"{backward_tiles(d)[0]}x{backward_tiles(d)[1]} at head_dim {d}"
                      for d in HEAD_DIMS)
    g.add_argument("--block-m", type=int, default=None, help=helps.get(
        "block_m", f"query rows per tile (default: the backward kernel's, {tiles}; 128 at "
                   "other head_dims)"))
    g.add_argument("--block-n", type=int, default=None,
                   help=helps.get("block_n", "KV rows per tile (default: the kernel's, 128)"))
    g.add_argument("--workers", type=int, default=DEFAULT_SM_COUNT, help=helps.get(
        "workers", f"persistent workers, one per SM (default {DEFAULT_SM_COUNT}, an H100/H200's "
                   f"SMs). shift and symmetric_shift run a head's units at once: they need at "
                   f"least that many and run a multiple of it"))


def _lengths(text: str) -> tuple[int, ...]:
    """--seqlens: comma-separated non-negative ints."""
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"lengths must be non-negative, got {text!r}")
    return values


SCHEDULE_MASK_HELP = ("full, causal or window:LEFT,RIGHT (default: the mask the schedule serves: "
                      "causal for symmetric_shift, full otherwise)")


def _problem(args: argparse.Namespace) -> Problem:
    """The problem of the options, in the backward kernel's tiles unless --block-m/-n say; the
    mask, where --mask is left out of show and plan, the one --schedule serves."""
    default_m, default_n = backward_tiles(args.hdim) if args.hdim in HEAD_DIMS else (128, 128)
    if args.mask is None:
        from .tools.emit import default_mask
        schedule = getattr(args, "schedule", None)
        args.mask = default_mask(schedule) if schedule in list_schedules() else "full"  # all, auto
    try:
        if getattr(args, "seqlens", None) is not None or getattr(args, "seqlens_k", None):
            if args.seqlens is None:
                raise ValueError("--seqlens-k needs --seqlens (the pack's query lengths)")
            return Problem.pack(args.seqlens, args.seqlens_k, heads_q=args.heads,
                                heads_kv=args.heads_kv, head_dim=args.hdim,
                                mask=Mask.parse(args.mask),
                                block_m=default_m if args.block_m is None else args.block_m,
                                block_n=default_n if args.block_n is None else args.block_n)
        return Problem(batch=args.batch, heads_q=args.heads, heads_kv=args.heads_kv,
                       seqlen_q=args.seqlen_q or args.seqlen, seqlen_k=args.seqlen_k or args.seqlen,
                       head_dim=args.hdim, mask=Mask.parse(args.mask),
                       block_m=default_m if args.block_m is None else args.block_m,
                       block_n=default_n if args.block_n is None else args.block_n)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _workers(args: argparse.Namespace) -> int:
    """The launch's workers: --workers (default the kernels' SM count); a schedule runs
    workers_used of them (dashgen.schedule.builders)."""
    if args.workers < 1:
        raise CliError(f"--workers must be a positive int, got {args.workers}")
    return args.workers


def _auto(args: argparse.Namespace, problem: Problem) -> int:
    """--schedule auto: the schedule and workers dashgen.attention picks for the problem on a
    GPU of --workers SMs (deterministic; a pack's: hybrid on every worker); args.schedule
    becomes its name, said on stderr. Returns the workers."""
    from .runtime.select import PACK_AUTO_SCHEDULES, resolve_schedule

    workers = _workers(args)
    if problem.is_pack:
        name = PACK_AUTO_SCHEDULES[problem.mask.kind == "causal"]
    else:
        try:
            name, workers = resolve_schedule(problem, "auto", None, workers)
        except (ValueError, StopIteration):
            raise CliError(f"--schedule auto: no schedule serves {problem.describe()}") from None
    print(f"auto: {name} on {workers} workers", file=sys.stderr)
    args.schedule = name
    return workers


def _summarize(name: str, problem: Problem, workers: int) -> ScheduleSummary:
    try:
        return summarize(name, problem, workers)
    except ValueError as exc:  # UnsupportedProblem, fewer workers than the schedule needs
        raise CliError(str(exc)) from None


def _full_view(args: argparse.Namespace, num_tasks: int, asked: list[str]) -> bool:
    """Whether to give the full per-task view: when an option in `asked` asks for it (refused
    above FULL_VIEW_MAX_TASKS tasks, and with --summary), else up to FULL_VIEW_DEFAULT_TASKS."""
    if args.summary:
        if asked:
            raise CliError(f"--summary cannot go with {asked[0]}, which needs the full "
                           f"per-task view")
        return False
    if asked and num_tasks > FULL_VIEW_MAX_TASKS:
        raise CliError(f"{asked[0]} needs the full per-task view, limited to "
                       f"{FULL_VIEW_MAX_TASKS:,} tasks; this problem has {num_tasks:,} (leave "
                       f"out {asked[0]} for the summary)")
    if asked and num_tasks > FULL_VIEW_DEFAULT_TASKS and not args.full:
        # Past the default limit the full view takes minutes and gigabytes: only on request.
        raise CliError(f"{asked[0]} needs the full per-task view, which past "
                       f"{FULL_VIEW_DEFAULT_TASKS:,} tasks runs only with --full (this problem "
                       f"has {num_tasks:,}; up to {FULL_VIEW_MAX_TASKS:,})")
    return bool(asked) or num_tasks <= FULL_VIEW_DEFAULT_TASKS


def _write_file(option: str, path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as exc:
        raise CliError(f"{option} {path}: {exc.strerror or exc}") from None


def _build(name: str, problem: Problem, workers: int) -> Schedule:
    try:
        return build_schedule(name, problem, workers)
    except ValueError as exc:  # UnsupportedProblem, unknown name, bad worker count
        raise CliError(str(exc)) from None


def cmd_schedules(args: argparse.Namespace) -> None:
    width = max(len(n) for n in BUILDERS)
    for name, builder in BUILDERS.items():
        tag = ""
        if builder.heads_together or builder.together is not None:
            # The fewest workers on the default problem (4096 tokens, head_dim 128) in the mask
            # the schedule serves: its minimum grows with the sequence.
            problem = next(p for p in (Problem(seqlen_q=4096, block_m=64, mask=m)
                                       for m in ("full", "causal")) if builder.supports(p) is None)
            tag = (f" [a head's units run at once: at least {min_workers(name, problem)} "
                   f"workers at seqlen 4096]")
        print(f"{name:<{width}}  {builder.summary}{tag}")


def cmd_show(args: argparse.Namespace) -> None:
    from .schedule.show import format_schedule
    from .schedule.summary import format_summary

    if args.json:
        _check_writable("--json", args.json)
    problem = _problem(args)
    workers = _auto(args, problem) if args.schedule == "auto" else _workers(args)
    summary = _summarize(args.schedule, problem, workers)  # refusals before any task is built
    asked = [opt for opt, on in (("--full", args.full), ("--json", args.json)) if on]
    if not _full_view(args, summary.num_tasks, asked):
        print(format_summary(summary))
        return
    schedule = _build(args.schedule, problem, workers)
    print(format_schedule(schedule))
    if args.json:
        _write_file("--json", args.json, schedule.to_json())


def cmd_plan(args: argparse.Namespace) -> None:
    from .schedule.simulate import Cost

    try:
        cost = (Cost.masked(args.c, args.r, args.signal_latency) if args.masked_cost
                else Cost(c=args.c, r=args.r, signal_latency=args.signal_latency))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.png:
        _check_writable("--png", args.png)
    if args.schedule_file:
        schedule = _verified_file("--schedule-file", args.schedule_file)
        _print_plan(args, schedule.problem, cost, [(schedule.name, schedule)])
        return
    problem = _problem(args)
    workers = _auto(args, problem) if args.schedule == "auto" else _workers(args)
    names = list_schedules() if args.schedule == "all" else [args.schedule]
    num_tasks = problem_tasks(problem)
    asked = [opt for opt, on in (("--full", args.full), ("--png", args.png), ("--text", args.text),
                                 ("--kernel-model", args.kernel_model)) if on]
    full = _full_view(args, num_tasks, asked)
    # Every refusal before the first line: the summaries build no task.
    summaries = {name: _plan_summary_or_skip(args, name, problem, workers) for name in names}
    if not full:
        _print_plan_summary(args, problem, workers, num_tasks, summaries)
        return
    _print_plan(args, problem, cost, [
        (name, summary if isinstance(summary, str) else build_schedule(name, problem, workers))
        for name, summary in summaries.items()])


def _print_plan(args: argparse.Namespace, problem: Problem, cost,
                schedules: list[tuple[str, Schedule | str]]) -> None:
    """The simulation's table (a str in place of a schedule: why it was skipped), then the text
    and PNG Gantt charts asked for."""
    from .schedule.simulate import simulate
    from .schedule.verify import verify

    print(f"plan: {problem.describe()}; "
          f"cost c={args.c:g} r={args.r:g} signal_latency={args.signal_latency:g}"
          + (" (c scaled by the kept fraction of each tile)" if args.masked_cost else ""))
    header = (f"{'schedule':<16} {'workers':>7} {'makespan':>10} {'lower bound':>12} "
              f"{'efficiency':>11} {'conflicts':>10}")
    print(header + (f" {'kernel model':>13}" if args.kernel_model else ""))
    results = []
    for name, schedule in schedules:
        if isinstance(schedule, str):
            print(f"{name:<16} skipped: {schedule}")
            continue
        report = verify(schedule)
        result = simulate(schedule, cost)
        results.append((name, result))
        row = (f"{name:<16} {schedule.num_workers:>7} {result.makespan:>10.2f} "
               f"{result.lower_bound:>12.2f} "
               f"{result.efficiency:>10.1%} {report.num_conflicts:>10}")
        if args.kernel_model:
            row += f" {_kernel_model_makespan(schedule, args):>13}"
        print(row)
    if args.kernel_model and runs_swapped(problem.head_dim, problem.mask.kind == "causal"):
        print(f"kernel model: a task's dQ goes to the writer after its compute, through 2 "
              f"buffers; at head_dim {problem.head_dim} the kernel hands it over in pieces during "
              f"the task's dQ MMAs, which the model leaves out, so its figure is optimistic there "
              f"(docs/design.md, `swapped-mainloop`)")
    if args.text:
        from .schedule.gantt import text_gantt

        for name, result in results:
            print(f"\n{name}:\n{text_gantt(result)}")
    if args.png and results:
        from .schedule.gantt import draw_gantt

        try:
            draw_gantt(results, args.png, title=f"dashgen plan: {problem.describe()}")
        except RuntimeError as exc:
            raise CliError(str(exc)) from None
        except OSError as exc:
            raise CliError(f"--png {args.png}: {exc.strerror or exc}") from None
        print(f"wrote {args.png}")


def _plan_summary_or_skip(args: argparse.Namespace, name: str, problem: Problem,
                          workers: int) -> ScheduleSummary | str:
    """The schedule's summary, or why `plan` skips it: a mask it does not serve, or (with
    --schedule all) fewer workers than it needs; one schedule asked for by name that cannot
    run on the workers is an error."""
    try:
        return summarize(name, problem, workers)
    except UnsupportedProblem as exc:
        return exc.reason
    except ValueError as exc:
        if args.schedule != "all":
            raise CliError(str(exc)) from None
        return str(exc)


def _print_plan_summary(args: argparse.Namespace, problem: Problem, workers: int,
                        num_tasks: int, summaries: dict[str, ScheduleSummary | str]) -> None:
    """plan without the simulation: the busiest worker against the bound, in tasks."""
    why = "" if args.summary else f" (--full simulates up to {FULL_VIEW_MAX_TASKS:,})"
    print(f"plan: {problem.describe()}; {num_tasks:,} tasks: a summary in tasks{why}")
    print(f"{'schedule':<16} {'workers':>7} {'busiest':>10} {'bound':>10} {'ratio':>7} "
          f"{'at worker':>9} {'min load':>10} {'mean load':>11}")
    for name, s in summaries.items():
        if isinstance(s, str):
            print(f"{name:<16} skipped: {s}")
            continue
        print(f"{name:<16} {s.workers_used:>7} {s.max_load:>10} {s.bound:>10} {s.ratio:>6.3f}x "
              f"{s.busiest:>9} {s.min_load:>10} {s.mean_load:>11.1f}")
    print(f"busiest: the tasks of the busiest worker; bound: ceil(tasks / {workers} workers); "
          f"ratio: busiest / bound")


def _kernel_model_makespan(schedule: Schedule, args: argparse.Namespace) -> str:
    from .tools.kernel_model import KernelCost, kernel_makespan

    if schedule.problem.gqa:
        return "n/a (GQA)"
    cost = KernelCost(c=args.c, r=args.r, signal_latency=args.signal_latency)
    return f"{kernel_makespan(schedule, cost):.2f}"


def _read_file(path: str) -> Schedule:
    """A schedule file or an emitted task table, unverified; unreadable or malformed: CliError."""
    from .schedule.files import read_schedule

    try:
        return read_schedule(path)  # either format; the message names the file
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ScheduleFormatError as exc:
        raise CliError(str(exc)) from None


def _verified_file(option: str, path: str) -> Schedule:
    """`option`'s schedule file, verified (a violation: exit 1 with the verifier's list)."""
    from .schedule.verify import VerificationError, verify

    schedule = _read_file(path)
    try:
        verify(schedule)
    except VerificationError as exc:
        print(f"dashgen: {option} {path} failed verification:\n{exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return schedule


def cmd_verify(args: argparse.Namespace) -> None:
    from .schedule.verify import VerificationError, verify

    schedule = _read_file(args.file)
    try:
        report = verify(schedule)
    except VerificationError as exc:
        print(f"{args.file}: INVALID\n{exc}")
        raise SystemExit(1) from None
    print(f"{args.file}: OK: schedule {schedule.name!r}, {report.num_tasks} tasks on "
          f"{report.num_workers} workers, {report.num_conflicts} order conflicts (Lemma 1)")


def _emit_problem(args: argparse.Namespace) -> Problem:
    """The problem of `dashgen emit`: the schedule's own mask by default, and the tiles of the
    backward kernel (dashgen.runtime.select.check_kernel_problem refuses others)."""
    from .tools.emit import default_mask
    from .runtime.select import check_kernel_problem

    if args.mask is None:
        args.mask = default_mask(args.schedule) if args.schedule != "auto" else "full"
    if args.gqa:
        if args.heads_kv is None:
            args.heads_kv = 1  # --gqa alone: every query head shares one KV head (MQA)
        if args.heads_kv >= args.heads:
            raise CliError(f"--gqa needs fewer KV heads than query heads, got --heads {args.heads} "
                           f"and --heads-kv {args.heads_kv} (try --heads 4 --heads-kv 1)")
    if args.hdim not in HEAD_DIMS:
        raise CliError(f"--hdim must be one of {', '.join(map(str, HEAD_DIMS))} for the "
                       f"kernels, got {args.hdim}")
    problem = _problem(args)
    if problem.is_pack:
        raise CliError("--seqlens: a pack's kernels read its lengths at run time: emit them "
                       "with --varlen (show, plan and verify take --seqlens)")
    try:
        check_kernel_problem(problem)
    except ValueError as exc:
        raise CliError("--" + str(exc).replace("block_", "block-", 1)) from None
    return problem


def _check_writable(option: str, path: str) -> None:
    """Refuse an output path whose folder does not exist or is a file, before any work."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise CliError(f"{option} {path}: no such directory {parent}")
    if Path(path).is_dir():
        raise CliError(f"{option} {path}: is a directory")


def _out_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--out {path}: {exc.strerror or exc}") from None
    if not path.is_dir():
        raise CliError(f"--out {path}: not a directory")
    return path


@contextlib.contextmanager
def _emit_errors(out: Path):
    """emit's failures: a compile error (exit 1, the source left in `out`) or a problem the
    kernels cannot run (one line, exit 2)."""
    from .codegen.compile import CompileError
    try:
        yield
    except CompileError as exc:
        print(f"dashgen emit: error: {exc}\n(the source is in {out}/{exc.source}.cu)",
              file=sys.stderr)
        raise SystemExit(1) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _print_emitted(kernels) -> None:
    from .tools.emit import report_lines
    for kernel in kernels:
        print(f"wrote {kernel.source_path}")
        print(f"  and {kernel.cubin_path}")
    for line in report_lines(kernels):
        print(line)


def _emit_pack(args: argparse.Namespace) -> None:
    """emit --varlen: the packed kernels of a schedule, head_dim and mask (no lengths: the
    kernels read them at run time)."""
    from .tools.emit import default_mask, emit_pack

    if args.schedule_file or args.seqlens:
        raise CliError("--varlen emits the packed kernels, which take their lengths at run "
                       "time: --schedule-file and --seqlens do not apply")
    if args.hdim not in HEAD_DIMS:
        raise CliError(f"--hdim must be one of {', '.join(map(str, HEAD_DIMS))} for the "
                       f"kernels, got {args.hdim}")
    schedule = args.schedule or "auto"
    mask = args.mask or (default_mask(schedule) if args.schedule else "causal")
    out = _out_dir(Path(args.out or "dashgen-out"))
    mode = "non-deterministic" if args.nondeterministic else "deterministic"
    print(f"emit packed (varlen) kernels: schedule {schedule}, head_dim {args.hdim}, {mask} "
          f"mask per document")
    print(f"  lengths read at run time; {args.dtype}, {mode}{', GQA' if args.gqa else ''}")
    with _emit_errors(out):
        kernels = emit_pack(out, schedule=schedule, head_dim=args.hdim, causal=mask == "causal",
                            dtype=args.dtype, deterministic=not args.nondeterministic,
                            gqa=args.gqa, head_dim_v=args.hdim_v)
    _print_emitted(kernels)


def cmd_emit(args: argparse.Namespace) -> None:
    from .tools.emit import GOLDEN_DIR, emit, write_golden
    from .schedule.verify import VerificationError

    if args.varlen:
        _emit_pack(args)
        return
    if args.golden:
        if args.out is None and not (GOLDEN_DIR.parent / "pyproject.toml").is_file():
            # An installed copy: GOLDEN_DIR would land beside site-packages.
            raise CliError(f"--golden rewrites a checkout's generated/, and this dashgen is "
                           f"installed ({GOLDEN_DIR.parent} is no checkout): run it from a "
                           f"checkout (pip install -e .) or give --out DIR")
        directory = _out_dir(Path(args.out) if args.out else GOLDEN_DIR)
        written, removed = write_golden(directory)
        print(f"wrote {len(written)} golden files to {directory}"
              + (f"; removed stale {', '.join(removed)}" if removed else ""))
        return
    if args.schedule_file:
        schedule = _verified_file("--schedule-file", args.schedule_file)
        problem = schedule.problem
    elif args.schedule is None:
        raise CliError("--schedule or --schedule-file is required (or --golden to rewrite "
                       "generated/)")
    else:
        problem = _emit_problem(args)
        workers = _auto(args, problem) if args.schedule == "auto" else _workers(args)
        schedule = _build(args.schedule, problem, workers)
    out = _out_dir(Path(args.out or "dashgen-out"))
    mode = "non-deterministic" if args.nondeterministic else "deterministic"
    print(f"emit {schedule.name}: {problem.describe()}")
    print(f"  {schedule.num_workers} workers; {args.dtype}, {mode}"
          f"{', GQA' if problem.gqa else ''}")
    with _emit_errors(out):
        try:
            emission = emit(schedule, out, dtype=args.dtype,
                            deterministic=not args.nondeterministic, head_dim_v=args.hdim_v)
        except VerificationError as exc:
            print(f"dashgen emit: schedule failed verification:\n{exc}", file=sys.stderr)
            raise SystemExit(1) from None
    if emission.tasks_path is not None:  # a schedule file's table; a policy needs none
        print(f"wrote {emission.tasks_path} ({emission.plan.num_tasks} tasks)")
    if args.nondeterministic and emission.selection.backward.deterministic:
        print("  dQ is converted in the main kernel here, which only the ordered backward can "
              "do: deterministic=False runs it (docs/design.md, unordered-unfused)")
    _print_emitted(emission.kernels)


def cmd_bench(args: argparse.Namespace) -> None:
    from .tools.bench import run
    try:
        status = run(args)
    except SystemExit as exc:  # the benchmark's own refusals: bad options, no GPU
        if isinstance(exc.code, str):
            raise CliError(exc.code) from None
        raise
    if status:
        raise SystemExit(status)


def _view_options(parser: argparse.ArgumentParser, full: str) -> None:
    g = parser.add_mutually_exclusive_group()
    g.add_argument("--full", action="store_true", help=(
        f"{full}, task by task, at any size up to {FULL_VIEW_MAX_TASKS:,} tasks (default: up to "
        f"{FULL_VIEW_DEFAULT_TASKS:,}, the summary above)"))
    g.add_argument("--summary", action="store_true", help=(
        "only the summary: tasks per worker and the busiest worker against the bound "
        "ceil(tasks / workers), computed without building the tasks (seconds at 1M tokens)"))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dashgen", description="Deterministic attention backward schedules for Hopper.")
    parser.add_argument("--version", action="version", version=f"dashgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("schedules", help="list the schedule builders",
                       description="List the schedule builders, one line each.")
    p.set_defaults(func=cmd_schedules)

    p = sub.add_parser("show", help="print a schedule's worker programs and dQ order",
                       description="Build a schedule and print each worker's program and the "
                                   "order in which every dQ tile is summed.")
    p.add_argument("--schedule", required=True, choices=list_schedules() + ["auto"],
                   help="a schedule, or auto: the one dashgen.attention picks (deterministic)")
    p.add_argument("--json", metavar="FILE", help="also write the schedule as an editable JSON file")
    _view_options(p, "the worker programs and dQ orders")
    _problem_options(p, helps={"mask": SCHEDULE_MASK_HELP})
    p.set_defaults(func=cmd_show, mask=None)  # None: the schedule's own mask (_problem)

    p = sub.add_parser("plan", help="simulate schedules and compare makespans",
                       description="Simulate schedules on a problem: makespan against the lower "
                                   "bound (total work / workers), with an optional Gantt chart.")
    p.add_argument("--schedule", default="all", choices=list_schedules() + ["all", "auto"],
                   help="a schedule, all (default), or auto: the one dashgen.attention picks")
    p.add_argument("--schedule-file", metavar="FILE",
                   help="simulate this schedule file (dashgen show --json, or an emitted task "
                        "table) instead; its own problem and workers")
    p.add_argument("--png", metavar="FILE", help="write a Gantt chart (needs matplotlib)")
    p.add_argument("--text", action="store_true", help="print a text Gantt chart per schedule")
    p.add_argument("--c", type=float, default=1.0, help="compute cost of one task (default 1)")
    p.add_argument("--r", type=float, default=0.2, help="cost of one dQ reduction (default 0.2)")
    p.add_argument("--signal-latency", type=float, default=0.05,
                   help="delay of a counter release seen by another worker (default 0.05)")
    p.add_argument("--kernel-model", action="store_true",
                   help="also give the makespan in the model of the kernel as built (a writer "
                        "warp adds dQ while the MMA goes on, 2 buffers; a checkout's "
                        "lab/calibrate.py fits its costs to a benchmark run)")
    p.add_argument("--masked-cost", action="store_true",
                   help="scale c by the fraction of each tile the mask keeps")
    _view_options(p, "the simulation")
    _problem_options(p, helps={"mask": SCHEDULE_MASK_HELP + "; with --schedule all, full"})
    p.set_defaults(func=cmd_plan, mask=None)  # None: the schedule's own mask (_problem)

    p = sub.add_parser("verify", help="verify a schedule file or an emitted task table",
                       description="Check a schedule file (dashgen show --json) or a task table "
                                   "(the .tasks.json of dashgen emit) against coverage, "
                                   "contiguity, total order and liveness; report order "
                                   "conflicts.")
    p.add_argument("file", metavar="FILE.json")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("emit", help="write a schedule's kernel sources and cubins",
                       description="Build and verify a schedule, then write the forward and "
                                   "backward kernel sources (<kernel>.cu; the backward contains "
                                   "the schedule's policy) and the cubins (compiled for sm_90a "
                                   "with NVRTC, through the cache; no GPU needed), and print "
                                   "ptxas's figures per kernel function. The kernels are the "
                                   "ones dashgen.attention would run for the problem. A "
                                   "--schedule-file runs as a task table, which is written "
                                   "too (<schedule>_<problem>.tasks.json).")
    p.add_argument("--schedule", choices=list_schedules() + ["auto"],
                   help="the schedule to emit, or auto: the one dashgen.attention picks")
    p.add_argument("--schedule-file", metavar="FILE",
                   help="emit a schedule file (dashgen show --json, verified): the table "
                        "backward and its task table, unless it is exactly its name's policy")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                   help="element type of q, k, v (default bf16)")
    p.add_argument("--out", metavar="DIR",
                   help="output folder (default ./dashgen-out; with --golden: generated/)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="the backward without ordered dQ adds (to measure what order costs)")
    p.add_argument("--gqa", action="store_true",
                   help="GQA/MQA: dK/dV summed over the query heads of a KV head in dkv_rank "
                        "order; needs --heads > --heads-kv (default --heads-kv 1). A problem "
                        "with fewer KV heads gets the GQA kernel anyway")
    p.add_argument("--varlen", action="store_true",
                   help="the packed kernels dashgen.attention_varlen runs (lengths read at run "
                        "time): --schedule (default auto: hybrid), --hdim, "
                        "--mask (default causal), --gqa, --dtype, --nondeterministic")
    p.add_argument("--golden", action="store_true",
                   help="rewrite the golden renders in generated/ (the other options are ignored)")
    p.add_argument("--hdim-v", type=int, default=None, metavar="D",
                   help="V's head_dim where it differs from --hdim: 128 with --hdim 192 "
                        "(DeepSeek's MLA; MHA)")
    _problem_options(p, helps={
        "mask": "full or causal (default: the mask the schedule serves: causal for "
                "symmetric_shift, full otherwise)",
        "block_m": "must be the backward kernel's tile (the default): "
                   + ", ".join(f"{backward_tiles(d)[0]} at head_dim {d}" for d in HEAD_DIMS),
        "block_n": f"likewise: {backward_tiles(HEAD_DIMS[0])[1]}",
    })
    # The schedule's own mask beats the shared "full".
    p.set_defaults(func=cmd_emit, mask=None)
    from .tools import bench
    p = sub.add_parser("bench", help="benchmark the kernels against PyTorch's (needs an sm_90 GPU)",
                       description=bench.__doc__.splitlines()[0] + " " + " ".join(
                           bench.__doc__.splitlines()[1:2]))
    bench.add_options(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
    except CliError as exc:
        print(f"dashgen {args.command}: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:
        # `dashgen show ... | head`: the reader left. Point stdout at /dev/null so the flush at
        # exit cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"dashgen {args.command}: error: standard output closed before the end",
              file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
