"""What dashgen.runtime.select picks on the benchmark's 20 configurations (16384 tokens, hidden
2048: heads = 2048 / head_dim, batch = 16384 / seqlen), as a table the select, golden and
compile tests share."""
from __future__ import annotations

from dashgen.codegen.variants import BackwardVariant, ForwardVariant
from dashgen.runtime.select import PACK_AUTO_SCHEDULES

T, F = True, False
SEQLENS = (1024, 2048, 4096, 8192, 16384)
# (head_dim, causal, seqlen): (schedule, workers, fused_convert, early_kv, persistent_forward),
# deterministic; deterministic=False runs the same where fused_convert is on (only the ordered
# kernel converts dQ in the kernel), else the unordered kernel of the same schedule.
BENCHMARK_PICKS = {
    (64, F, 1024): ("shift", 128, T, T, T),
    (64, F, 2048): ("shift", 128, F, T, F),
    (64, F, 4096): ("shift", 128, F, T, F),
    (64, F, 8192): ("shift", 128, F, F, F),
    (64, F, 16384): ("fa3", 132, F, F, F),  # one head a wave under shift (`auto-fa3-long-full`)
    (64, T, 1024): ("symmetric_shift", 128, T, T, T),
    (64, T, 2048): ("symmetric_shift", 128, T, T, T),
    (64, T, 4096): ("symmetric_shift", 128, F, T, T),
    (64, T, 8192): ("symmetric_shift", 128, F, F, T),
    (64, T, 16384): ("symmetric_shift", 128, F, F, T),
    (128, F, 1024): ("shift", 128, T, T, T),
    (128, F, 2048): ("shift", 128, T, T, T),
    (128, F, 4096): ("shift", 128, F, T, T),
    (128, F, 8192): ("shift", 128, F, F, T),
    (128, F, 16384): ("shift", 128, F, F, F),
    (128, T, 1024): ("symmetric_shift", 128, T, T, T),
    (128, T, 2048): ("symmetric_shift", 128, T, T, T),
    (128, T, 4096): ("symmetric_shift", 128, T, T, T),
    (128, T, 8192): ("symmetric_shift", 128, F, F, T),
    (128, T, 16384): ("symmetric_shift", 128, F, F, T),
}
# The rows whose deterministic backward runs two dQ writers (the non-deterministic one: one).
TWO_WRITERS = {(128, F, 16384), (128, T, 16384)}


def picked_variants(key) -> tuple[ForwardVariant, BackwardVariant, BackwardVariant]:
    """The bf16 forward and the deterministic and non-deterministic backward of a row."""
    head_dim, causal, _ = key
    name, _, fused, early, persistent = BENCHMARK_PICKS[key]
    ordered = BackwardVariant("bf16", head_dim, causal, name, deterministic=True,
                              fused_convert=fused, early_kv=early,
                              dq_writers=2 if key in TWO_WRITERS else 1)
    return (ForwardVariant("bf16", head_dim, causal, persistent=persistent), ordered,
            ordered if fused else BackwardVariant("bf16", head_dim, causal, name,
                                                  deterministic=False, early_kv=early))


def all_picked_variants() -> set:
    """Every variant the table names: what the benchmark's sweep runs."""
    return {variant for key in BENCHMARK_PICKS for variant in picked_variants(key)}


def other_schedule_variants() -> set:
    """The goldens beside the sweep's: a deterministic head_dim 128 backward of each schedule the
    sweep does not run, for the mask it is meant for, and of the schedule-file table walk; and
    the packed kernels of a pack's auto schedule (PACK_AUTO_SCHEDULES, early K/V),
    deterministic, per head_dim and mask."""
    packed = {v for d in (64, 128) for causal in (False, True)
              for v in (ForwardVariant("bf16", d, causal, varlen=True),
                        BackwardVariant("bf16", d, causal, PACK_AUTO_SCHEDULES[causal],
                                        early_kv=True, varlen=True))}
    return packed | {BackwardVariant("bf16", 128, False, name)
                     for name in ("spt", "spt_listed", "descending", "hybrid", "table")}
