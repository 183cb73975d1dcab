"""Emit what a schedule runs as: the rendered kernel sources and the compiled cubins with ptxas's
figures; and the golden renders in generated/ that a test checks. The kernels are the ones
dashgen.runtime.select picks for the problem (the one place that chooses). A named schedule's
backward contains its policy (the source differs per schedule); a schedule file runs the table
backward, and emit writes its task table as JSON beside it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..caches import memo
from ..runtime.select import DEFAULT_SM_COUNT, Selection, problem_for, select, select_pack
from ..schedule.builders import build_schedule, list_schedules, unsupported_reason
from ..schedule.files import TASKS_FORMAT
from ..schedule.ir import Schedule
from ..schedule.lower import TASK_WORDS, KernelPlan, lower
from ..schedule.problem import Problem
from ..schedule.verify import verify
from ..codegen.compile import Cubin
from ..codegen.cubins import get_or_compile
from ..codegen.render import KernelSource, render_variant
from ..codegen.variants import BackwardVariant, ForwardVariant

KERNEL_MASKS = ("full", "causal")  # what the kernels implement
TASK_WORDS_LEGEND = ("batch << 16 | head", "n_block << 16 | m_block", "dq_rank",
                     "dkv_rank (-1: none)")

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "generated"  # in a checkout
GOLDEN_COMMAND = "dashgen emit --golden"
GOLDEN_DTYPE = "bf16"
GOLDEN_HEAD_DIMS = (64, 128)
# The golden kernels: every variant `select` picks on the benchmark's sweep (16384 tokens,
# hidden 2048, seqlen 1k-16k, both masks, both modes), so the files show what runs.
GOLDEN_SWEEP_SEQLENS = (1024, 2048, 4096, 8192, 16384)
_GOLDEN_PATTERNS = ("*.cu", "*.tasks.json", "README.md")  # old task tables are removed  # what write_golden owns in its folder


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
    variant: ForwardVariant | BackwardVariant
    cubin: Cubin | None = None
    cubin_path: Path | None = None
    cached: bool = False

    @property
    def dynamic_smem_bytes(self) -> int | None:
        """The main kernel's dynamic shared memory, as the compiled C++ layout says."""
        return None if self.cubin is None else self.cubin.constant(self.variant.smem_symbol)


@dataclass(frozen=True)
class Emission:
    schedule: Schedule
    selection: Selection
    plan: KernelPlan | None  # a schedule file's table; None for a named schedule's policy
    tasks_path: Path | None
    kernels: tuple[EmittedKernel, ...]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def is_policy(schedule: Schedule) -> bool:
    """Whether `schedule` is exactly its name's policy on its worker count."""
    if schedule.name not in list_schedules():
        return False
    if unsupported_reason(schedule.name, schedule.problem) is not None:
        return False
    try:
        built = build_schedule(schedule.name, schedule.problem, schedule.num_workers)
    except ValueError:
        return False
    return built.num_workers == schedule.num_workers and built.workers == schedule.workers


def emit(schedule: Schedule, out_dir: Path, *, dtype: str = GOLDEN_DTYPE,
         deterministic: bool = True, compile: bool = True,
         head_dim_v: int | None = None) -> Emission:
    """Verify `schedule`, write the sources of the kernels that run it (dashgen.runtime.select)
    to `out_dir`, then compile them (through the cache) and write the cubins. A schedule that is
    its name's policy (what build_schedule gives) runs that policy's backward; any other (a
    schedule file) the table backward, and its lowered task table is written too.

    head_dim_v: V's head_dim where it differs (128 under 192, MLA; Selection.with_head_dim_v).
    Sources are written before compiling, so a CompileError leaves them on disk to read.
    Raises VerificationError, ValueError (a problem the kernels cannot run) or CompileError.
    """
    verify(schedule)
    policy = is_policy(schedule)
    sel = select(schedule.problem, dtype, deterministic=deterministic,
                 schedule=schedule.name if policy else schedule,
                 num_workers=schedule.num_workers,
                 sm_count=max(DEFAULT_SM_COUNT, schedule.num_workers))
    if head_dim_v is not None:
        sel = sel.with_head_dim_v(head_dim_v)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = tasks_path = None
    if not policy:
        plan = lower(schedule)
        name = f"{schedule.name}_{problem_tag(schedule.problem, schedule.num_workers)}.tasks.json"
        tasks_path = _write(out_dir / name, tasks_json(plan).encode())
    return Emission(schedule, sel, plan, tasks_path,
                    write_kernels((sel.forward, sel.backward), out_dir, compile))


def write_kernels(variants, out_dir: Path, compile: bool = True) -> tuple[EmittedKernel, ...]:
    """Each variant's source into out_dir, then (compile) its cubin through the cache. Sources
    first, so a CompileError leaves them on disk to read."""
    kernels = []
    for variant in variants:
        src = render_variant(variant)
        kernels.append(EmittedKernel(src, _write(out_dir / f"{src.name}.cu", src.text.encode()),
                                     variant))
    if compile:
        for i, kernel in enumerate(kernels):
            cubin, cached = get_or_compile(kernel.source)
            path = _write(out_dir / f"{kernel.source.name}.cubin", cubin.data)
            kernels[i] = EmittedKernel(kernel.source, kernel.source_path, kernel.variant, cubin,
                                       path, cached)
    return tuple(kernels)


def emit_pack(out_dir: Path, *, schedule: str = "auto", head_dim: int = 128,
              causal: bool = True, dtype: str = GOLDEN_DTYPE, deterministic: bool = True,
              gqa: bool = False, compile: bool = True,
              head_dim_v: int | None = None) -> tuple[EmittedKernel, ...]:
    """The varlen forward and backward a packed batch runs (dashgen.runtime.select.select_pack):
    one pair for every pack of that head_dim, mask and schedule, since they read the lengths at
    run time. head_dim_v as in emit. Raises ValueError (a schedule no pack runs, a V width
    without kernels) or CompileError."""
    sel = select_pack(dtype, head_dim, causal, schedule, deterministic=deterministic, gqa=gqa)
    if head_dim_v is not None:
        sel = sel.with_head_dim_v(head_dim_v)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_kernels((sel.forward, sel.backward), out_dir, compile)


def report_lines(kernels: tuple[EmittedKernel, ...]) -> list[str]:
    """One line per kernel function (registers, spill bytes, shared memory bytes static+dynamic,
    compile time), each ptxas diagnostic on a line of its own below its function."""
    rows: list[tuple[str, str, tuple[str, ...]]] = []
    for kernel in kernels:
        if kernel.cubin is None:
            continue
        main_name = kernel.source.name
        when = "cached" if kernel.cached else f"{kernel.cubin.compile_seconds:.1f} s"
        names = sorted(kernel.cubin.resources, key=lambda n: (n != main_name, n))
        for name in names:
            usage = kernel.cubin.resources[name]
            dynamic = kernel.dynamic_smem_bytes if name == main_name else 0
            # static+dynamic shared memory; unpadded, so that the longest names' lines stay
            # near 100 columns
            smem = f"{usage.shared_bytes}+{dynamic}B"
            rows.append((name, f"{usage.registers:>3} regs spill {usage.spill_bytes}B "
                               f"smem {smem} {when}", usage.warnings))
    width = max((len(name) for name, _, _ in rows), default=0)
    lines = []
    for name, text, warnings in rows:
        lines.append(f"{name:<{width}} {text}")
        lines += [f"  ptxas: {w}" for w in warnings]
    return lines


# -- golden renders ----------------------------------------------------------------------------

@memo(max_entries=1)
def golden_variants() -> tuple[ForwardVariant | BackwardVariant, ...]:
    """Every kernel variant `select` picks on the benchmark's sweep, then one deterministic
    head_dim 128 backward of every other schedule (each for the mask it is meant for) and of
    the schedule-file table walk, in a stable order."""
    found: dict[ForwardVariant | BackwardVariant, None] = {}
    for head_dim in GOLDEN_HEAD_DIMS:
        heads = 2048 // head_dim
        for causal in (False, True):
            for seqlen in GOLDEN_SWEEP_SEQLENS:
                problem = problem_for(16384 // seqlen, heads, heads, seqlen, seqlen, head_dim,
                                      causal)
                for deterministic in (True, False):
                    sel = select(problem, GOLDEN_DTYPE, deterministic=deterministic)
                    found.setdefault(sel.forward)
                    found.setdefault(sel.backward)
    swept = {v.schedule for v in found if isinstance(v, BackwardVariant)}
    for name in [*list_schedules(), "table"]:
        if name not in swept:
            causal = name != "table" and default_mask(name) == "causal"
            found.setdefault(BackwardVariant(GOLDEN_DTYPE, 128, causal, name))
    # The packed kernels of a pack's "auto", deterministic, per head_dim and mask.
    for head_dim in GOLDEN_HEAD_DIMS:
        for causal in (False, True):
            sel = select_pack(GOLDEN_DTYPE, head_dim, causal, "auto")
            found.setdefault(sel.forward)
            found.setdefault(sel.backward)
    return tuple(sorted(found, key=lambda v: v.kernel_name))


def _golden_readme(variants) -> str:
    return "\n".join([
        "# generated/: golden renders, written by the emitter (do not edit)",
        "",
        f"Regenerate with `{GOLDEN_COMMAND}`; tests/test_golden.py compares a fresh",
        "render with these files byte for byte.",
        "",
        f"- `<kernel>.cu`: {len(variants)} kernel variants: the ones dashgen.runtime.select picks "
        "on the",
        f"  benchmark's sweep ({GOLDEN_DTYPE}, 16384 tokens, hidden 2048, seqlen 1k-16k, full "
        "and causal,",
        "  deterministic and not), then a head_dim 128 backward of every other schedule and of",
        "  the schedule-file table walk, then the packed (`_varlen`) forward and backward of a",
        "  pack's auto schedule per head_dim and mask. A backward's name carries its schedule,",
        "  and its source holds that schedule's policy (templates/include/dashgen/sched/).",
        "",
    ])


def golden_files() -> dict[str, str]:
    """File name -> text of every golden render."""
    files: dict[str, str] = {}
    variants = golden_variants()
    for variant in variants:
        src = render_variant(variant)
        files[f"{src.name}.cu"] = src.text
    files["README.md"] = _golden_readme(variants)
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
