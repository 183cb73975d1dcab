"""Emit what a schedule runs as: the rendered kernel sources, the lowered task table as JSON, and
the compiled cubins with ptxas's figures; and the golden renders in generated/ that a test checks.

The kernels are the ones the runtime runs for the configuration (dashgen.kernels.
forward_config/backward_config: the Hopper-native Sm90FwdConfig/Sm90BwdConfig; with
hopper=False the mma.sync FwdConfig/BwdConfig, what kernel="mma" runs), and the schedule is built
with that backward's tiles (backward_blocks).
The kernel sources do not depend on the schedule (it reaches the kernel as a task table), so a
schedule changes the .tasks.json file, never the .cu files.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from .cache import get_or_compile
from .compile import Cubin
from .ir import Schedule
from .kernels import (BwdConfig, FwdConfig, Sm90BwdConfig, Sm90FwdConfig, backward_blocks,
                      backward_config, backward_kind, forward_config, render_config)
from .lower import TASK_WORDS, KernelPlan, lower
from .problem import Problem
from .render import TEMPLATES_DIR, KernelSource
from .schedules import build_schedule, list_schedules, unsupported_reason
from .verify import verify

KERNEL_MASKS = ("full", "causal")  # what the kernels implement (FwdConfig/BwdConfig.causal)
TASKS_FORMAT = "dashgen.tasks/1"
TASK_WORDS_LEGEND = ("batch << 16 | head", "n_block << 16 | m_block", "dq_rank",
                     "dkv_rank (-1: none)")

GOLDEN_DIR = TEMPLATES_DIR.parent / "generated"
GOLDEN_COMMAND = "python -m dashgen.emit --golden"
GOLDEN_DTYPE = "bf16"
GOLDEN_HEAD_DIMS = (64, 128)
# The canonical problem of the golden task tables: 2 heads of 512 rows, in the tiles of the
# backward that serves it: 4 KV tiles of 128 rows per head (Hopper kernel at head_dim 64 and 128;
# the mma.sync kernel's 64-row tiles would give 8). Six workers (fewer than the 8 KV tiles) so that
# workers walk several segments and a head straddles two waves: the cases where a table walk or a
# wave-aware order can go wrong, in files still small enough to read (at most 128 tasks).
GOLDEN_BATCH = 1
GOLDEN_HEADS = 2
GOLDEN_SEQLEN = 512
GOLDEN_WORKERS = 6
_GOLDEN_PATTERNS = ("*.cu", "*.tasks.json", "README.md")  # what write_golden owns in its folder


# -- problem checks and names -------------------------------------------------------------------

def masks_served(schedule: str) -> tuple[str, ...]:
    """The kernel masks (of full, causal) the named builder serves, in that order."""
    return tuple(kind for kind in KERNEL_MASKS
                 if unsupported_reason(schedule, Problem(mask=kind)) is None)


def default_mask(schedule: str) -> str:
    """The mask a schedule is meant for: causal for symmetric_shift, full for the others."""
    served = masks_served(schedule)
    if not served:
        raise ValueError(f"schedule {schedule!r} serves none of the kernel masks {KERNEL_MASKS}")
    return served[0]


def serving_backward(dtype: str, head_dim: int, gqa: bool, hopper: bool = True) -> str:
    """Names the backward kernel that serves the configuration and its tiles, for messages."""
    block_m, block_n = backward_blocks(dtype, head_dim, gqa, hopper)
    if backward_kind(dtype, head_dim, gqa, hopper) == "sm90":
        kernel = f"the Hopper backward ({Sm90BwdConfig.prefix})"
    else:
        kernel = f"the mma.sync backward ({BwdConfig.prefix})"
    return (f"{kernel} serves {dtype}, head_dim {head_dim}{', GQA' if gqa else ''} "
            f"with {block_m}x{block_n} tiles")


def tile_error(name: str, value: int, dtype: str, head_dim: int, gqa: bool,
               hopper: bool = True) -> str | None:
    """The message refusing `name` (block_m or --block-m, ...) = `value` where the serving
    backward kernel's tile differs; None where it matches."""
    block_m, block_n = backward_blocks(dtype, head_dim, gqa, hopper)
    need = block_m if name.replace("-", "_").endswith("block_m") else block_n
    if value == need:
        return None
    return (f"{name} must be {need}, the serving kernel's tile, got {value}: "
            f"{serving_backward(dtype, head_dim, gqa, hopper)}")


def check_kernel_problem(problem: Problem, dtype: str = GOLDEN_DTYPE, hopper: bool = True) -> None:
    """Raise ValueError naming the field when the kernels cannot run `problem`: its tiles must be
    those of the backward kernel that serves it (dashgen.kernels.backward_blocks)."""
    for name, value in (("block_m", problem.block_m), ("block_n", problem.block_n)):
        message = tile_error(name, value, dtype, problem.head_dim, problem.gqa, hopper)
        if message is not None:
            raise ValueError(message)
    if problem.mask.kind not in KERNEL_MASKS:
        raise ValueError(f"mask must be one of {', '.join(KERNEL_MASKS)} for the kernels, "
                         f"got {problem.mask}")


def kernel_configs(problem: Problem, dtype: str = GOLDEN_DTYPE, deterministic: bool = True,
                   trace: bool = False, hopper: bool = True,
                   ) -> tuple[FwdConfig | Sm90FwdConfig, BwdConfig | Sm90BwdConfig]:
    """The configs of the forward and the backward that serve `problem` (the ones the runtime
    runs: dashgen.kernels.forward_config/backward_config; GQA follows the problem)."""
    causal = problem.mask.kind == "causal"
    fwd = forward_config(dtype, problem.head_dim, causal, hopper)  # names a bad dtype, head_dim
    check_kernel_problem(problem, dtype, hopper)
    return fwd, backward_config(dtype, problem.head_dim, causal, gqa=problem.gqa,
                                deterministic=deterministic, trace=trace, hopper=hopper)


def problem_tag(problem: Problem, num_workers: int) -> str:
    """A short file-name tag: b1_h16kv4_s4096_d128_causal_w132 (kv and x only when they differ)."""
    heads = f"h{problem.heads_q}" + (f"kv{problem.heads_kv}" if problem.gqa else "")
    seq = f"s{problem.seqlen_q}" + (f"x{problem.seqlen_k}" if problem.seqlen_k != problem.seqlen_q
                                    else "")
    return f"b{problem.batch}_{heads}_{seq}_d{problem.head_dim}_{problem.mask.kind}_w{num_workers}"


# -- the task table as a file ---------------------------------------------------------------------

def tasks_json(plan: KernelPlan) -> str:
    """The task table exactly as the kernel reads it, one task per line so a diff reads per task."""
    head = {
        "format": TASKS_FORMAT,
        "schedule": plan.schedule_name,
        "problem": plan.problem.to_dict(),
        "num_workers": plan.num_workers,
        "num_tasks": plan.num_tasks,
        "task_words": list(TASK_WORDS_LEGEND),
        "worker_offsets": list(plan.worker_offsets),
    }
    lines = ["{"] + [f"  {json.dumps(key)}: {json.dumps(value)}," for key, value in head.items()]
    words = plan.tasks
    rows = [json.dumps(list(words[i:i + TASK_WORDS])) for i in range(0, len(words), TASK_WORDS)]
    lines.append('  "tasks": [\n    ' + ",\n    ".join(rows) + "\n  ]" if rows else '  "tasks": []')
    lines.append("}")
    return "\n".join(lines) + "\n"


# -- emit ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EmittedKernel:
    source: KernelSource
    source_path: Path
    dynamic_smem_bytes: int  # requested at launch by the main function, not seen by ptxas
    cubin: Cubin | None = None
    cubin_path: Path | None = None
    cached: bool = False


@dataclass(frozen=True)
class Emission:
    schedule: Schedule
    plan: KernelPlan
    tasks_path: Path
    kernels: tuple[EmittedKernel, ...]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def emit(schedule: Schedule, out_dir: Path, *, dtype: str = GOLDEN_DTYPE,
         deterministic: bool = True, compile: bool = True, hopper: bool = True) -> Emission:
    """Verify and lower `schedule`, write its task table and both kernel sources to `out_dir`,
    then compile them (through the cache) and write the cubins.

    Sources are written before compiling, so a CompileError leaves them on disk to read.
    Raises VerificationError, ValueError (a problem the kernels cannot run) or CompileError.
    """
    verify(schedule)
    fwd_cfg, bwd_cfg = kernel_configs(schedule.problem, dtype, deterministic, hopper=hopper)
    plan = lower(schedule)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = f"{schedule.name}_{problem_tag(schedule.problem, schedule.num_workers)}.tasks.json"
    tasks_path = _write(out_dir / name, tasks_json(plan).encode())
    written = [(render_config(cfg), cfg.smem_bytes) for cfg in (fwd_cfg, bwd_cfg)]
    kernels = [EmittedKernel(src, _write(out_dir / f"{src.name}.cu", src.text.encode()), smem)
               for src, smem in written]
    if compile:
        for i, kernel in enumerate(kernels):
            cubin, cached = get_or_compile(kernel.source)
            path = _write(out_dir / f"{kernel.source.name}.cubin", cubin.data)
            kernels[i] = EmittedKernel(kernel.source, kernel.source_path,
                                       kernel.dynamic_smem_bytes, cubin, path, cached)
    return Emission(schedule, plan, tasks_path, tuple(kernels))


def report_lines(kernels: tuple[EmittedKernel, ...]) -> list[str]:
    """One line per kernel function: registers, spills, shared memory, compile time, diagnostics."""
    rows = []
    for kernel in kernels:
        if kernel.cubin is None:
            continue
        main_name = kernel.source.name
        when = ("cached" if kernel.cached
                else f"compiled in {kernel.cubin.compile_seconds:.2f} s")
        names = sorted(kernel.cubin.resources, key=lambda n: (n != main_name, n))
        for name in names:
            usage = kernel.cubin.resources[name]
            dynamic = kernel.dynamic_smem_bytes if name == main_name else 0
            rows.append((name, f"{usage.registers:>3} registers  {usage.spill_bytes} spill bytes  "
                               f"smem {usage.shared_bytes} static + {dynamic} dynamic  {when}"
                         + ("  ptxas: " + "; ".join(usage.warnings) if usage.warnings else "")))
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{name:<{width}}  {text}" for name, text in rows]


# -- golden renders ----------------------------------------------------------------------------

def golden_problem(head_dim: int, mask: str) -> Problem:
    """The canonical problem, in the tiles of the backward kernel that serves it."""
    block_m, block_n = backward_blocks(GOLDEN_DTYPE, head_dim, False)
    return Problem(batch=GOLDEN_BATCH, heads_q=GOLDEN_HEADS, seqlen_q=GOLDEN_SEQLEN,
                   head_dim=head_dim, mask=mask, block_m=block_m, block_n=block_n)


def _golden_readme() -> str:
    dims = " and ".join(map(str, GOLDEN_HEAD_DIMS))
    backwards, tiles = [], []
    for head_dim in GOLDEN_HEAD_DIMS:
        fwd = forward_config(GOLDEN_DTYPE, head_dim, False)
        cfg = backward_config(GOLDEN_DTYPE, head_dim, False)
        kinds = ["Hopper" if isinstance(c, (Sm90FwdConfig, Sm90BwdConfig)) else "mma.sync"
                 for c in (fwd, cfg)]
        backwards.append(f"  - head_dim {head_dim}: the {kinds[0]} forward `{fwd.prefix}_*`, "
                         f"the {kinds[1]} backward `{cfg.prefix}_*`")
        tiles.append(f"  - head_dim {head_dim}: blocks {cfg.block_m}x{cfg.block_n} "
                     f"({GOLDEN_SEQLEN // cfg.block_n} KV tiles per head)")
    return "\n".join([
        "# generated/: golden renders, written by the emitter (do not edit)",
        "",
        f"Regenerate with `{GOLDEN_COMMAND}`; tests/test_golden.py compares a fresh",
        "render with these files byte for byte.",
        "",
        f"- `<kernel>.cu`: the kernel sources for {GOLDEN_DTYPE}, head_dim {dims}, full and causal",
        "  masks: forward, and backward deterministic and non-deterministic; the kernels that run",
        "  for the configuration (dashgen.kernels.forward_config and backward_config):",
        *backwards,
        "  They do not depend on the schedule, which reaches the backward kernel as a task table.",
        "- `<schedule>_hdim<d>_<mask>.tasks.json`: the task table of every schedule, for every",
        f"  mask it serves, on batch {GOLDEN_BATCH}, {GOLDEN_HEADS} heads, seqlen {GOLDEN_SEQLEN}, "
        f"{GOLDEN_WORKERS} workers, in the tiles",
        "  of the backward kernel that serves it:",
        *tiles,
        "  Fewer workers than KV tiles, so workers walk several segments and a head straddles",
        "  two waves.",
        "",
    ])


def golden_files() -> dict[str, str]:
    """File name -> text of every golden render."""
    files: dict[str, str] = {}
    for head_dim in GOLDEN_HEAD_DIMS:
        for mask in KERNEL_MASKS:
            problem = golden_problem(head_dim, mask)
            for deterministic in (True, False):
                for cfg in kernel_configs(problem, GOLDEN_DTYPE, deterministic):
                    src = render_config(cfg)
                    files[f"{src.name}.cu"] = src.text
            for name in list_schedules():
                if mask in masks_served(name):
                    schedule = build_schedule(name, problem, GOLDEN_WORKERS)
                    verify(schedule)
                    files[f"{name}_hdim{head_dim}_{mask}.tasks.json"] = tasks_json(lower(schedule))
    files["README.md"] = _golden_readme()
    return files


def write_golden(directory: Path = GOLDEN_DIR) -> tuple[list[str], list[str]]:
    """Rewrite the golden renders in `directory`; returns (written, removed) file names.

    Removes the stale files it owns (sources, task tables, README) that no render produces.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    files = golden_files()
    removed = sorted({p.name for pattern in _GOLDEN_PATTERNS for p in directory.glob(pattern)
                      if p.is_file()} - set(files))
    for name in removed:
        (directory / name).unlink()
    for name, text in files.items():
        _write(directory / name, text.encode())
    return sorted(files), removed


def main(argv: list[str] | None = None) -> None:
    """`python -m dashgen.emit ...` is `dashgen emit ...`."""
    from .cli import main as cli_main

    cli_main(["emit", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    main()
