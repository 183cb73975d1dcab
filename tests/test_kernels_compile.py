"""Every kernel variant that runs compiles for sm_90a on the CPU: the ones dashgen.runtime.select
picks on the benchmark's sweep (dashgen.tools.emit.golden_variants) plus the traced, fp16 and
GQA builds, and the forwards at the head dims that compile but do not run yet, each without
spills, without ptxas's slow-path fallbacks, at the register cap
setmaxnreg needs, and within the shared memory an sm_90 block may use, as the cubin's own
constant says. Rendering is strict and the variants refuse what no kernel implements.

The cubins go through the test run's cache folder (the root conftest.py), so a variant compiled
here is read, not compiled again, by the tests that load it.
"""
from __future__ import annotations

import dataclasses

import jinja2
import pytest

from dashgen.codegen.compile import (SETMAXNREG_IGNORED, WGMMA_ARRIVE_INJECTED, WGMMA_SERIALIZED,
                                     WGMMA_WAIT_INJECTED)
from dashgen.codegen import variants
from dashgen.codegen.cubins import get_or_compile
from dashgen.tools.emit import golden_variants
from dashgen.codegen.render import render, render_variant
from dashgen.codegen.variants import (BACKWARD_CONSTANTS, FORWARD_HEAD_DIMS, FORWARD_TILES,
                                      HEAD_DIMS, SM90_MAX_SMEM_BYTES, BackwardVariant,
                                      ForwardVariant, backward_tiles)

from benchmark_picks import all_picked_variants, other_schedule_variants

# setmaxnreg needs the register cap at entry: 65536 / 384 threads, rounded down to 8.
ENTRY_REGISTERS = 168
# The most local memory a named policy's walk may take in the scheduler lane (measured: 0 for
# every policy but symmetric_shift, whose walk keeps 8 bytes).
SCHEDULER_SPILL_BYTES = 16
# hybrid's pack walk holds both of a mask's orders (shift and fa3, symmetric_shift and
# descending) in the scheduler lane: 48 bytes under a full mask, 180 under a causal one at both
# head_dims (symmetric_shift's alone: 100, in test_varlen.py). Unlike the other walks' twins, its
# twin without the dQ order spills too (32 and 164 bytes): the walk alone outgrows the lane's
# registers (docs/design.md, `pack-auto`).
HYBRID_PACK_SPILL_BYTES = 192
# At head_dim 128 the MMA warpgroups keep dQ's accumulator live while dK's wgmmas run (dQ's
# hand-off overlaps them); with dK/dV stored 16 bytes at a time at a segment's end
# (docs/design.md, `dkv-16-byte-stores`) only the GQA backward without the dQ order spills
# there (16 bytes; 0-56 by variant before, most of it reloads). head_dim 64 spills none.
# At 192 (64x96 tasks, 48 keys a warpgroup) dK^T + dV^T (144) and S + dP (48) fill 192 of the
# 240 registers. The walk's task count is read from shared memory at each task's end, warpgroup 1
# computes its one dQ piece once, and the GQA epilogue adds from one address a lane
# (docs/design.md, `swapped-spills`): the plain 192 kernels spill none (40-60 bytes before), a
# window with soft-capping 48 (120 before), GQA 48 and a GQA pack 72 (236-240 before); q/k 192
# with v 128 (dV^T 48) none. The 64x96 tasks measured 0.92-1.42x the 64x64 ones that spilled
# none, faster in 19 of 20 configurations (docs/design.md, `swapped-mainloop`).
MMA_SPILL_BYTES = {64: 0, 128: 16, 192: 24, 256: 0}
# Under GQA at 192 the epilogue's fp32 adds of dK^T/dV^T, once a segment: up to 24 bytes more.
GQA_SPILL_BYTES = {192: 24}
# dq_last at head_dim 64 keeps the dS tiles of the softmax loop beside dK's accumulators: 56
# bytes, accepted because it measured 1.14-1.26x faster at 128k-256k (docs/design.md,
# `dq-last-long`). At 128 it spills no more than the others.
DQ_LAST_SPILL_BYTES = {64: 56, 128: 16}
# Soft-capping (attn/softcap.cuh) keeps t = tanh(...) beside dS's operands: up to 24 bytes more
# in the packed GQA kernels without the dQ order (measured, not yet tuned); none elsewhere past
# the bounds above.
SOFTCAP_SPILL_BYTES = 24
# A sliding window (attn/mask.cuh) tests both bounds in the masked loop as one unsigned range
# compare; written as two compares it spilled 48-72 bytes in the GQA kernels at head_dim 128
# (docs/design.md, `sliding-window`). Now none.
WINDOW_SPILL_BYTES = 0
# At head_dims 192 and 256 (the swapped mainloop, 64-row KV tiles) a producer-warpgroup lane (24
# registers) keeps a few words in local memory where a pack's walk runs (8 bytes stored, 8
# reloaded) and where the traced dQ writer lands its pieces (up to 16 stored, 24 reloaded at
# 192; nvdisasm: every such access follows setmaxnreg's decrease to 24); the MMA warpgroups
# spill none.
SWAPPED_LANE_SPILL_BYTES = 40
# Two dQ writers at head_dim 64 under GQA (Overrides only, no policy picks them): the MMA
# warpgroups keep one word in local memory, stored once after setmaxnreg's increase and
# reloaded once (nvdisasm of the table walk's kernel): 8 bytes, none without GQA.
TWO_WRITERS_GQA_SPILL_BYTES = {64: 8}
# Fallbacks that cost the main loop its overlap: never accepted.
SLOW_PATHS = (SETMAXNREG_IGNORED, WGMMA_SERIALIZED, WGMMA_WAIT_INJECTED)

B, F = BackwardVariant, ForwardVariant
# head_dim 256, the swapped mainloop (attn/bwd_mainloop_swapped.cuh): each schedule kind, mode,
# GQA, fp16, the modifiers, packs, early_kv (also compiled at the candidate tiles, below)
VARIANTS_256 = [
    B("bf16", 256, True, "spt_listed"),
    B("bf16", 256, False, "shift"),
    B("bf16", 256, False, "fa3", deterministic=False),
    B("fp16", 256, True, "symmetric_shift", gqa=True),
    B("bf16", 256, True, "descending", early_kv=True),
    B("bf16", 256, True, "table", trace=True),
    B("bf16", 256, False, "spt_listed", window=True),
    B("bf16", 256, True, "spt", softcap=True, gqa=True),
    B("bf16", 256, True, "spt", varlen=True, gqa=True),
    B("bf16", 256, False, "spt", varlen=True, deterministic=False),
]
EXTRA_VARIANTS = [
    # trace=True (the GPU tests' trace = IR check), with and without the per-problem options
    B("bf16", 128, True, "symmetric_shift", trace=True),
    B("fp16", 64, False, "shift", trace=True),
    B("bf16", 64, True, "spt", fused_convert=True, early_kv=True, trace=True),
    B("bf16", 128, True, "table", trace=True),
    # GQA / MQA: dK/dV summed in dkv_rank order
    B("bf16", 128, True, "symmetric_shift", gqa=True),
    B("bf16", 128, False, "shift", deterministic=False, gqa=True),
    B("bf16", 64, False, "fa3", gqa=True, fused_convert=True, early_kv=True),
    B("bf16", 64, True, "spt", deterministic=False, gqa=True, early_kv=True),
    B("bf16", 64, True, "table", gqa=True, fused_convert=True, early_kv=True),
    # dq_last: the long sequences' ordered backward (select's DQ_LAST_FROM_KV_TILES)
    B("bf16", 128, True, "spt", dq_last=True),
    B("bf16", 64, True, "spt_listed", dq_last=True),
    B("bf16", 128, False, "fa3", dq_last=True, gqa=True),
    # two dQ writer lanes (select's DQ_WRITERS_FROM_KV_TILES; at 64 Overrides only)
    B("bf16", 128, True, "spt_listed", dq_last=True, dq_writers=2),
    B("bf16", 128, False, "shift", dq_writers=2, gqa=True),
    B("bf16", 128, True, "table", trace=True, dq_writers=2),
    B("bf16", 64, True, "symmetric_shift", dq_writers=2),
    B("bf16", 64, False, "shift", dq_writers=2, gqa=True, early_kv=True),
    B("bf16", 64, True, "spt_listed", deterministic=False, dq_writers=2),
    B("bf16", 64, True, "table", trace=True, dq_writers=2),
    # fp16: the same templates with f16 wgmma inputs
    B("fp16", 128, True, "symmetric_shift"),
    B("fp16", 128, False, "fa3", deterministic=False),
    B("fp16", 64, True, "descending", gqa=True, fused_convert=True),
    F("fp16", 64, False),
    F("fp16", 128, True, persistent=True),
    # head_dim 96, computed in the 128 kernels (KERNEL_HEAD_DIMS): every part that stores to the
    # tensors (dK/dV, the fused and the separate dQ converters, O) and each kind of kernel
    B("bf16", 96, True, "spt_listed", fused_convert=True),
    B("bf16", 96, True, "spt_listed", dq_last=True),
    B("bf16", 96, False, "shift", gqa=True),
    B("bf16", 96, False, "fa3", deterministic=False),
    B("fp16", 96, True, "symmetric_shift"),
    B("bf16", 96, True, "spt", varlen=True, gqa=True),
    F("bf16", 96, False),
    F("bf16", 96, True, persistent=True),
    F("fp16", 96, True, varlen=True),
    # the padded head dims beside 96: 32 and 48 in the 64 kernels, 80 and 112 in the 128 ones,
    # each kind of kernel and the parts that store
    B("bf16", 80, True, "spt_listed", fused_convert=True),
    B("bf16", 80, False, "shift", gqa=True),
    B("fp16", 80, True, "spt", varlen=True, gqa=True),
    B("bf16", 80, False, "spt_listed", window=True, softcap=True),
    F("bf16", 80, False),
    F("bf16", 80, True, persistent=True),
    F("fp16", 80, True, varlen=True, softcap=True),
    B("bf16", 32, True, "symmetric_shift"),
    B("bf16", 32, False, "fa3", gqa=True, fused_convert=True),
    F("bf16", 32, True),
    B("bf16", 48, True, "spt_listed", dq_last=True),
    F("fp16", 48, False, varlen=True),
    B("bf16", 112, True, "spt_listed"),
    F("bf16", 112, False, window=True),
    # softcap (attn/softcap.cuh): the tanh in the score's place, 1 - t^2 in dS; each kind
    B("bf16", 128, True, "spt_listed", softcap=True),
    B("bf16", 128, False, "shift", softcap=True, gqa=True),
    B("bf16", 64, True, "symmetric_shift", softcap=True, fused_convert=True),
    B("bf16", 64, True, "spt_listed", softcap=True, dq_last=True),
    B("bf16", 128, False, "fa3", softcap=True, deterministic=False),
    B("fp16", 96, True, "spt", softcap=True, varlen=True, gqa=True),
    F("bf16", 128, True, softcap=True),
    F("bf16", 64, False, softcap=True, persistent=True),
    F("bf16", 96, True, softcap=True, varlen=True),
    # a sliding window (sched::WindowTiling, attn/mask.cuh's window_*): each schedule it runs
    B("bf16", 64, False, "spt", window=True),
    B("bf16", 128, False, "spt_listed", window=True),
    B("bf16", 128, False, "spt", window=True, gqa=True),
    B("bf16", 128, False, "spt", window=True, gqa=True, deterministic=False),
    B("fp16", 96, False, "fa3", window=True),
    B("bf16", 64, False, "descending", window=True, gqa=True),
    B("bf16", 128, False, "spt_listed", window=True, softcap=True),
    # The fused dQ converter under a window (WindowTiling's receiving tiles and counts).
    B("bf16", 128, False, "spt_listed", window=True, fused_convert=True),
    B("fp16", 64, False, "spt", window=True, fused_convert=True, gqa=True),
    B("bf16", 128, False, "spt_listed", window=True, softcap=True, fused_convert=True, gqa=True),
    B("fp16", 96, False, "spt_listed", window=True, fused_convert=True, early_kv=True),
    F("bf16", 64, False, window=True),
    F("bf16", 128, False, window=True, softcap=True),
    F("fp16", 96, False, window=True),
    # a sliding window in a pack (sched::PackWalk over WindowTiling, the plan's deal keys)
    B("bf16", 64, False, "spt", window=True, varlen=True, early_kv=True),
    B("bf16", 128, False, "spt", window=True, varlen=True, early_kv=True, gqa=True),
    B("fp16", 96, False, "descending", window=True, varlen=True, early_kv=True),
    F("bf16", 128, False, window=True, varlen=True),
    *VARIANTS_256,
    # head_dim 192 in the same mainloop: dQ's three pieces split two and one
    B("bf16", 192, True, "spt_listed"),
    B("bf16", 192, False, "shift", gqa=True),
    B("fp16", 192, True, "symmetric_shift"),
    B("bf16", 192, False, "fa3", deterministic=False),
    B("bf16", 192, True, "table", trace=True),
    B("bf16", 192, False, "spt_listed", window=True, softcap=True),
    B("bf16", 192, True, "spt", varlen=True, gqa=True),
    # q/k 192 with V 128 (MLA): V's and dO's two column blocks, each schedule kind and mode,
    # the modifiers (MHA: BackwardVariant refuses GQA there)
    B("bf16", 192, True, "spt_listed", head_dim_v=128),
    B("bf16", 192, True, "symmetric_shift", head_dim_v=128),
    B("bf16", 192, False, "shift", head_dim_v=128),
    B("bf16", 192, False, "fa3", deterministic=False, head_dim_v=128),
    B("fp16", 192, True, "spt", head_dim_v=128),
    B("bf16", 192, True, "table", trace=True, head_dim_v=128),
    B("bf16", 192, False, "spt_listed", window=True, softcap=True, head_dim_v=128),
    B("bf16", 192, True, "descending", early_kv=True, head_dim_v=128),
    # ... and packed
    B("bf16", 192, True, "hybrid", varlen=True, early_kv=True, head_dim_v=128),
    B("bf16", 192, False, "hybrid", varlen=True, early_kv=True, head_dim_v=128),
    B("bf16", 192, True, "spt", varlen=True, early_kv=True, deterministic=False, head_dim_v=128),
]
# The forwards past head_dim 128 (192, 256, and 192 with V 128 wide):
# every dtype, mask and kind. Not golden: the benchmark's sweep runs 64 and 128.
WIDE_FORWARD_VARIANTS = [
    F(dtype, head_dim, causal, persistent=kind == "persistent", varlen=kind == "varlen",
      head_dim_v=head_dim_v)
    for head_dim, head_dim_v in FORWARD_TILES if head_dim > 128
    for dtype in ("bf16", "fp16") for causal in (False, True)
    for kind in ("one_tile", "persistent", "varlen")]
GOLDEN_VARIANTS = golden_variants()
VARIANTS = list(dict.fromkeys([*GOLDEN_VARIANTS, *EXTRA_VARIANTS, *WIDE_FORWARD_VARIANTS]))


@pytest.fixture(scope="module")
def compiled():
    """variant -> cubin, each compiled once for the module (through the disk cache)."""
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = get_or_compile(render_variant(variant))[0]
        return cache[variant]
    return get


def test_golden_variants_are_what_the_benchmark_runs():
    """select, with its verified plans, picks exactly the table's variants on the sweep
    (tests/benchmark_picks.py), and none of the extras compiled here."""
    assert set(GOLDEN_VARIANTS) == all_picked_variants() | other_schedule_variants()
    assert not set(GOLDEN_VARIANTS) & set(EXTRA_VARIANTS)
    assert not set(GOLDEN_VARIANTS) & set(WIDE_FORWARD_VARIANTS)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.kernel_name)
def test_variant_compiles_without_spills_or_slow_paths(variant, compiled):
    cubin = compiled(variant)
    name = variant.kernel_name
    assert cubin.data[:4] == b"\x7fELF"
    assert "--gpu-architecture=sm_90a" in cubin.options
    expected = {name}
    if isinstance(variant, BackwardVariant):
        expected |= {f"{name}_preprocess", f"{name}_convert"}
        if variant.varlen:
            expected.add(f"{name}_plan")  # the pack deal's orders (pack_plan.cuh)
    assert set(cubin.resources) == expected, cubin.log
    for function, usage in cubin.resources.items():
        main_backward = function == name and isinstance(variant, BackwardVariant)
        mma = 0
        if main_backward:
            mma = (DQ_LAST_SPILL_BYTES if variant.dq_last
                   else MMA_SPILL_BYTES)[variant.kernel_head_dim]
            mma += SOFTCAP_SPILL_BYTES if variant.softcap else 0
            mma += WINDOW_SPILL_BYTES if variant.window else 0
            mma += GQA_SPILL_BYTES.get(variant.kernel_head_dim, 0) if variant.gqa else 0
            if variant.gqa and variant.dq_writers == 2:
                mma += TWO_WRITERS_GQA_SPILL_BYTES.get(variant.kernel_head_dim, 0)
        lane = (SWAPPED_LANE_SPILL_BYTES if main_backward and variant.swapped
                and (variant.varlen or variant.trace) else 0)
        allowed = mma + lane
        if main_backward and not variant.table:
            # A named policy's walk runs in the scheduler lane, inside the producer
            # warpgroup's 24 registers, and may keep a few words in local memory; the same
            # kernel walking a table (everything else identical) must spill no more than the
            # MMA warpgroups' bytes, so the rest are the walk's (docs/design.md,
            # `scheduler-lane`).
            hybrid_pack = variant.varlen and variant.schedule == "hybrid"
            allowed += HYBRID_PACK_SPILL_BYTES if hybrid_pack else SCHEDULER_SPILL_BYTES
            # A pack has no table walk; its twin without the dQ order (the same walk, no rank
            # waits) spills no more than the MMA warpgroups' bytes either.
            twin = (dataclasses.replace(variant, deterministic=False, fused_convert=False)
                    if variant.varlen or variant.window
                    else dataclasses.replace(variant, schedule="table"))
            assert compiled(twin).resources[twin.kernel_name].spill_bytes <= mma + lane + (
                HYBRID_PACK_SPILL_BYTES if hybrid_pack else 0)
        assert usage.spill_bytes <= allowed, f"{function} spills {usage.spill_bytes} bytes:\n{cubin.log}"
        assert usage.stack_frame_bytes <= allowed, f"{function}: {usage.stack_frame_bytes} B stack"
        assert not any(usage.has_warning(code) for code in SLOW_PATHS), usage.warnings
    main = cubin.resources[name]
    assert main.registers == ENTRY_REGISTERS, cubin.log
    # ptxas injects a warpgroup.arrive where registers a wgmma reads are touched between
    # wgmmas. The head_dim-64 full-mask backwards (dS to the dK MMA from registers, no
    # ds_stmatrix) had it until their mask selected the exponent (docs/design.md,
    # `bwd-mask-select`); now no kernel has it, and no kernel warns at all.
    for function, usage in cubin.resources.items():
        assert not usage.has_warning(WGMMA_ARRIVE_INJECTED), (function, usage.warnings)
        assert usage.warnings == (), usage.warnings


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.kernel_name)
def test_the_cubin_says_how_much_shared_memory_its_main_kernel_takes(variant, compiled):
    cubin = compiled(variant)
    smem = cubin.constant(variant.smem_symbol)
    assert variant.smem_symbol == f"{variant.kernel_name}_smem_bytes"
    # More than the tiles of Q it stages at the very least, no more than a block may opt into.
    assert variant.block_m * variant.head_dim * 2 < smem <= SM90_MAX_SMEM_BYTES


def forward_smem_bytes(head_dim: int, head_dim_v: int, block_n: int, persistent: bool) -> int:
    """attn/fwd_sm90.cuh's layout without O's staging tile (past head_dim 128): the Q tile, two K
    and two V stages, the barriers (Q's empty one in the persistent kernel) and 1 KB of
    alignment slack, 2 bytes an element."""
    tiles = (128 * head_dim + 2 * block_n * (head_dim + head_dim_v)) * 2
    return tiles + (10 if persistent else 9) * 8 + 1024


@pytest.mark.parametrize("variant", WIDE_FORWARD_VARIANTS, ids=lambda v: v.kernel_name)
def test_the_wide_forwards_take_the_longest_key_tile_that_fits(variant, compiled):
    """Past head_dim 128 the key tile is the longest multiple of 16 whose stages fit an sm_90
    block (variants.FORWARD_TILES): the cubin's shared memory is that arithmetic's, and 16
    keys more would not fit."""
    smem = compiled(variant).constant(variant.smem_symbol)
    d, dv, bn = variant.head_dim, variant.head_dim_v, variant.block_n
    assert variant.block_m == 128 and bn % 16 == 0
    assert smem == forward_smem_bytes(d, dv, bn, variant.persistent) <= SM90_MAX_SMEM_BYTES
    assert forward_smem_bytes(d, dv, bn + 16, variant.persistent) > SM90_MAX_SMEM_BYTES


@pytest.mark.parametrize("variant", [F("bf16", 128, True), B("fp16", 64, False, "fa3", gqa=True),
                                     B("bf16", 128, True, "symmetric_shift", fused_convert=True,
                                       early_kv=True)],
                         ids=["fwd", "bwd", "bwd-options"])
def test_rendered_header_says_do_not_edit_and_names_template(variant):
    source = render_variant(variant)
    first, second = source.text.splitlines()[:2]
    assert first.startswith("// generated by dashgen ") and first.endswith("-- do not edit")
    assert f"from templates/{variant.template}" in first
    assert source.template == variant.template
    assert second == f"// kernel {source.name}: {variant!r}"
    assert source.name == variant.kernel_name
    assert "{{" not in source.text and "{%" not in source.text
    assert f"\n{source.name}(" in source.text  # the name is the kernel symbol
    assert f"{source.name}_smem_bytes = " in source.text


@pytest.mark.parametrize("variant, name", [
    (B("bf16", 128, True, "spt"), "dashgen_bwd_bf16_d128_causal_spt_det"),
    (B("bf16", 128, True, "symmetric_shift", fused_convert=True, early_kv=True),
     "dashgen_bwd_bf16_d128_causal_symshift_det_fconv_ekv"),
    (B("fp16", 64, False, "table", deterministic=False, gqa=True, early_kv=True, trace=True),
     "dashgen_bwd_fp16_d64_full_table_nondet_gqa_ekv_trace"),
    (B("bf16", 128, True, "spt_listed", dq_last=True, dq_writers=2),
     "dashgen_bwd_bf16_d128_causal_sptl_det_dqlast_w2"),
    (F("bf16", 64, False), "dashgen_fwd_bf16_d64_full"),
    (F("fp16", 128, True, persistent=True), "dashgen_fwd_fp16_d128_causal_persistent"),
    (F("bf16", 256, True, varlen=True), "dashgen_fwd_bf16_d256_causal_varlen"),
    (F("fp16", 192, False, head_dim_v=192), "dashgen_fwd_fp16_d192_full"),
    (F("bf16", 192, False, persistent=True, head_dim_v=128),
     "dashgen_fwd_bf16_d192v128_full_persistent"),
])
def test_a_variants_name_is_built_from_its_fields(variant, name):
    assert variant.kernel_name == name


def test_a_forward_of_one_width_is_the_variant_without_head_dim_v():
    """head_dim_v defaults to head_dim, and a forward whose V is as wide as Q renders (name,
    repr, source) as before V had a width of its own."""
    assert F("bf16", 128, True, head_dim_v=128) == F("bf16", 128, True)
    assert F("bf16", 192, True).head_dim_v == 192
    assert repr(F("bf16", 64, False, persistent=True)) == (
        "ForwardVariant(dtype='bf16', head_dim=64, causal=False, persistent=True, varlen=False)")
    assert repr(F("bf16", 192, False, head_dim_v=128)).endswith(", head_dim_v=128)")
    assert "kHeadDimV" not in render_variant(F("bf16", 256, False)).text
    assert "kHeadDimV = 128;" in render_variant(F("bf16", 192, False, head_dim_v=128)).text


@pytest.mark.parametrize("head_dim, kernel", [(32, 64), (48, 64), (80, 128), (112, 128)])
def test_the_built_padded_head_dims_render_their_kernels_with_the_tensors_width(head_dim,
                                                                                kernel):
    for variant in (B("bf16", head_dim, True, "spt_listed"), F("bf16", head_dim, False)):
        text = render_variant(variant).text
        assert f"kHeadDim = {kernel};" in text and f"kTensorHeadDim = {head_dim};" in text
        assert variant.kernel_head_dim == kernel and f"_d{head_dim}_" in variant.kernel_name
    assert B("bf16", head_dim, False, "fa3").constants == BACKWARD_CONSTANTS[kernel, False]


def test_head_dim_96_renders_the_128_kernel_with_the_tensors_width():
    """96 has no 128-byte swizzle blocks of its own: the kernel is the 128 one, told the
    tensors' width (attn/head_dim.cuh); the widths it computes with are 128's."""
    for variant in (B("bf16", 96, True, "spt_listed"), F("bf16", 96, False)):
        text = render_variant(variant).text
        assert "kHeadDim = 128;" in text and "kTensorHeadDim = 96;" in text
        assert variant.kernel_head_dim == 128 and "_d96_" in variant.kernel_name
    assert B("bf16", 96, False, "fa3").constants == BACKWARD_CONSTANTS[128, False]
    assert F("bf16", 96, True).tiles == FORWARD_TILES[128, 128]
    for variant in (B("bf16", 128, True, "spt_listed"), F("bf16", 128, False)):
        assert "kTensorHeadDim" not in render_variant(variant).text
    with pytest.raises(ValueError, match=r"^head_dim_v must be 96 at head_dim 96, got 64$"):
        F("bf16", 96, False, head_dim_v=64)


def test_softcap_renders_its_switch_only_where_set():
    """A soft-capped variant renders Cfg::kSoftcap and names itself _softcap; the others render
    what they did before the switch existed (the golden sources)."""
    for variant in (B("bf16", 128, True, "spt_listed", softcap=True), F("bf16", 64, False, softcap=True)):
        assert "kSoftcap = 1;" in render_variant(variant).text
        assert variant.kernel_name.endswith("_softcap") and "softcap=True" in repr(variant)
    for variant in (B("bf16", 128, True, "spt_listed"), F("bf16", 64, False)):
        assert "kSoftcap" not in render_variant(variant).text and "softcap" not in repr(variant)


def test_the_backward_constants_are_the_tiles_schedules_are_built_in():
    for (head_dim, causal), constants in BACKWARD_CONSTANTS.items():
        variant = B("bf16", head_dim, causal, "fa3")
        assert (variant.block_m, variant.block_n) == backward_tiles(head_dim)
        assert (variant.block_m, variant.block_n) == (constants.block_m, constants.block_n)
    assert backward_tiles(64) == (128, 128) and backward_tiles(128) == (64, 128)
    assert backward_tiles(96) == backward_tiles(128)  # computed in the 128 kernel
    assert backward_tiles(192) == (64, 96) and backward_tiles(256) == (64, 64)
    assert B("bf16", 256, True, "fa3").dq_per_warpgroup
    assert not B("bf16", 192, True, "fa3").dq_per_warpgroup  # measured no faster there
    assert B("bf16", 192, True, "fa3").swapped and B("bf16", 256, True, "fa3").swapped
    for head_dim in (192, 256):  # the swapped mainloop has no fused converter
        with pytest.raises(ValueError, match=rf"^head_dim {head_dim} runs the swapped mainloop"):
            B("bf16", head_dim, True, "spt", fused_convert=True)
    assert backward_tiles(32) == backward_tiles(48) == backward_tiles(64)  # the 64 kernel's
    assert backward_tiles(80) == backward_tiles(112) == backward_tiles(128)
    with pytest.raises(ValueError, match=r"^head_dim must be one of \(32, 48, 64, 80, 96, 112, "
                                         r"128, 192, 256\), got 72"):
        backward_tiles(72)


@dataclasses.dataclass(frozen=True)
class _Partial:
    """A config with only some of a variant's fields."""

    dtype: str = "bf16"
    head_dim: int = 128
    kernel_name: str = "partial"


@pytest.mark.parametrize("template", [B.template, F.template])
def test_render_raises_on_a_missing_config_field(template):
    with pytest.raises(jinja2.UndefinedError):
        render(template, _Partial())


@pytest.mark.parametrize("variant", [F, B])
@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(dtype="fp32", head_dim=128), ValueError, r"^dtype must be one of "),
    (dict(dtype="bf16", head_dim=72), ValueError, r"^head_dim must be one of "),
    (dict(dtype="fp16", head_dim=320), ValueError, r"^head_dim must be one of "),
])
def test_variants_refuse_what_no_kernel_implements(variant, kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        variant(causal=False, **kwargs, **({"schedule": "fa3"} if variant is B else {}))


def test_a_head_dim_is_built_but_refused_until_opened(monkeypatch):
    """A backward built but not yet run on a GPU (BACKWARD_BUILT_HEAD_DIMS) compiles and is
    refused by the runtime until opened (variants.OPENED_HEAD_DIMS), as 192 and 256 were."""
    monkeypatch.setattr(variants, "BACKWARD_BUILT_HEAD_DIMS", (320,))
    assert variants.served_head_dims() == HEAD_DIMS
    with pytest.raises(ValueError, match=r"^head_dim must be one of \(32, 48, 64, 80, 96, 112, "
                                         r"128, 192, 256\), got 320$"):
        backward_tiles(320)
    monkeypatch.setattr(variants, "OPENED_HEAD_DIMS", (320,))
    assert variants.served_head_dims() == (*HEAD_DIMS, 320)
    with pytest.raises(ValueError,
                       match=r"^head_dim must be one of \(32, 48, 64, 80, 96, 112, 128, 192, "
                             r"256\), got 72"):
        F("bf16", 72, False)


@pytest.mark.parametrize("head_dim, head_dim_v, widths", [
    (256, 128, r"\[256\]"), (128, 64, r"\[128\]"), (192, 64, r"\[128, 192\]")])
def test_a_forward_refuses_a_v_width_without_a_kernel(head_dim, head_dim_v, widths):
    with pytest.raises(ValueError, match=rf"^head_dim_v must be one of {widths} at head_dim "
                                         rf"{head_dim}, got {head_dim_v}$"):
        F("bf16", head_dim, False, head_dim_v=head_dim_v)


def test_a_backward_names_a_schedule_policy_and_its_header_holds_it():
    with pytest.raises(ValueError, match=r"^schedule must be one of "):
        B("bf16", 128, False, "nope")
    from dashgen.schedule.builders import BUILDERS
    for name, policy in BUILDERS.items():
        variant = B("bf16", 128, False, name)
        assert variant.schedule_id == policy.kernel_id
        text = render_variant(variant).text
        assert f"struct {variant.policy_class} " in text  # the policy's source is inlined
        assert f"sched::{variant.policy_class}<Tl>" in text
    table = render_variant(B("bf16", 128, False, "table")).text
    assert "sched::TableWalk" in table and "struct Fa3 " not in table


@pytest.mark.parametrize("kwargs, name", [(dict(causal=1), "causal"),
                                          (dict(causal=False, gqa="yes"), "gqa"),
                                          (dict(causal=False, trace=None), "trace")])
def test_switches_must_be_bools(kwargs, name):
    with pytest.raises(TypeError, match=rf"^{name} must be a bool"):
        B("bf16", 128, schedule="fa3", **kwargs)
    with pytest.raises(TypeError, match=r"^persistent must be a bool"):
        F("bf16", 128, False, persistent=1)


def test_dq_last_is_refused_at_a_head_dim_without_it(monkeypatch):
    import dashgen.codegen.variants as variants
    monkeypatch.setattr(variants, "DQ_LAST_HEAD_DIMS", (128,))
    with pytest.raises(ValueError, match=r"^dq_last serves head_dim \(128,\), got head_dim 64"):
        B("bf16", 64, True, "spt", dq_last=True)
    monkeypatch.undo()
    assert B("bf16", 64, True, "spt", dq_last=True).dq_last
    with pytest.raises(TypeError, match=r"^dq_last must be a bool"):
        B("bf16", 128, True, "spt", dq_last=1)
    assert B("bf16", 128, True, "spt", dq_last=True).kernel_name.endswith("_dqlast")


def test_a_listed_schedule_is_refused_for_packs():
    with pytest.raises(ValueError, match=r"^schedule='spt_listed' deals one fixed shape's units"):
        B("bf16", 128, True, "spt_listed", varlen=True, early_kv=True)
    assert B("bf16", 128, True, "spt_listed").listed and not B("bf16", 128, True, "spt").listed


# The candidates (variants.BACKWARD_CANDIDATES, not yet served), each over the variants of the
# head dims it covers: local-memory bytes allowed in the main kernel, more under GQA, more in a
# pack, and shared memory by V's width. 64x80 keeps one or two words more than 64x64 (56-84
# bytes; under GQA the epilogue's adds up to 240 more). Bounds a GPU run weighs against their
# speed.
CANDIDATE_BOUNDS = {
    "256-64x80": (96, 240, 0, {256: 219_696}),
}
CANDIDATE_CASES = [
    (name, v) for name, table in sorted(variants.BACKWARD_CANDIDATES.items())
    for v in VARIANTS
    if isinstance(v, BackwardVariant) and (v.kernel_head_dim, v.causal) in table]


def test_256_hands_dq_over_through_a_buffer_per_warpgroup():
    """256's pieces of dQ: warpgroup w's through buffer w, dO on one stage to make room
    (docs/design.md, `dq-buffer-per-warpgroup`): two 16 KB buffers where a second 32 KB dO stage
    was, 215,600 bytes of shared memory (231,968 with one buffer and two dO stages)."""
    variant = B("bf16", 256, False, "shift")
    source = render_variant(variant)
    assert "static constexpr int kDqPerWarpgroup = 1;" in source.text
    cubin = get_or_compile(source)[0]
    assert cubin.constant(variant.smem_symbol) == 215_600
    assert cubin.resources[variant.kernel_name].spill_bytes == 0, cubin.log


@pytest.mark.parametrize("name, variant", CANDIDATE_CASES,
                         ids=[f"{n}-{v.kernel_name}" for n, v in CANDIDATE_CASES])
def test_candidates_compile_and_fit(name, variant, monkeypatch):
    for key, constants in variants.BACKWARD_CANDIDATES[name].items():
        monkeypatch.setitem(BACKWARD_CONSTANTS, key, constants)
    want = variants.BACKWARD_CANDIDATES[name][variant.kernel_head_dim, variant.causal]
    assert variant.constants == want
    cubin = get_or_compile(render_variant(variant))[0]
    main = cubin.resources[variant.kernel_name]
    mma, gqa, pack, smem_bytes = CANDIDATE_BOUNDS[name]
    hybrid_pack = variant.varlen and variant.schedule == "hybrid"  # as the served kernels'
    allowed = mma + (HYBRID_PACK_SPILL_BYTES if hybrid_pack else SCHEDULER_SPILL_BYTES)
    allowed += gqa if variant.gqa else 0
    allowed += pack if variant.varlen else 0
    allowed += SWAPPED_LANE_SPILL_BYTES if variant.varlen or variant.trace else 0
    assert main.spill_bytes <= allowed, cubin.log
    assert not any(main.has_warning(code) for code in SLOW_PATHS), main.warnings
    assert main.registers == ENTRY_REGISTERS, cubin.log
    smem = cubin.constant(variant.smem_symbol)
    assert smem == smem_bytes[variant.head_dim_v or variant.head_dim] <= SM90_MAX_SMEM_BYTES


@pytest.mark.parametrize("fields, refusal", [
    (dict(dq_writers=3), "dq_writers must be 1 or 2"),
    (dict(dq_writers=True), "dq_writers must be 1 or 2"),
    (dict(dq_writers=2, fused_convert=True), "dq_writers=2 needs"),
    (dict(head_dim=256, dq_writers=2), "dq_writers=2 needs"),
    (dict(head_dim=192, dq_writers=2), "dq_writers=2 needs"),
    (dict(head_dim=64, dq_writers=2, dq_last=True), "dq_writers=2 with dq_last at head_dim 64"),
])
def test_two_dq_writers_are_refused_where_no_kernel_has_them(fields, refusal):
    """The second writer takes the fused converter's warp 2 and one buffer of the one-piece
    hand-off, in the 64 and 128 kernels: fused_convert, the swapped head dims and the pair
    that spills (dq_last at 64) are refused by name."""
    args = dict(dtype="bf16", head_dim=128, causal=True, schedule="spt")
    with pytest.raises(ValueError, match=refusal):
        B(**{**args, **fields})


def test_one_dq_writer_renders_no_writer_constant():
    """The goldens (one writer) render as before: the constant is only in the two-writer
    kernels, whose entry point takes the second writer's lane."""
    one = render_variant(B("bf16", 128, True, "spt_listed", dq_last=True))
    two = render_variant(B("bf16", 128, True, "spt_listed", dq_last=True, dq_writers=2))
    assert "kDqWriters" not in one.text and "kDqWriters = 2" in two.text

