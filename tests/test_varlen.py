"""Packed variable-length attention on the CPU: dashgen.attention_varlen's argument checks (each
error names its argument, host checks of CPU offsets before the device check), the resolved
options and the workers a pack's schedule needs, flash_attn_varlen_func's refusals, the lse
layout lse_by_head turns into FlashAttention's, the per-tile buffer layout of a pack
(params.cuh, PackedRows) and the workspace around it, the varlen kernel variants, their rendered
sources and (the slow tests, test_compile_...) their NVRTC builds, and the custom ops' fake
kernels on fake CUDA tensors.

No kernel runs here: the device is faked as in test_op_errors (checks._device_facts,
checks._DEVICE_TYPE, FakeTensorMode)."""
from __future__ import annotations

import dataclasses
import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dashgen.codegen.compile import compile_kernel  # noqa: E402
from dashgen.codegen.render import render_variant  # noqa: E402
from dashgen.codegen.variants import (  # noqa: E402
    BACKWARD_CONSTANTS, SCHEDULE_POLICIES, SM90_MAX_SMEM_BYTES, BackwardVariant, ForwardVariant)
from dashgen.interfaces.flash_attn import flash_attn_varlen_func  # noqa: E402
from dashgen.caches import clear_caches  # noqa: E402
from dashgen.runtime import checks, op, op_varlen  # noqa: E402
from dashgen.runtime.op_common import Options  # noqa: E402
from dashgen.runtime.op_varlen import (  # noqa: E402
    PACK_SCHEDULES, attention_varlen, check_varlen_inputs, lse_by_head)
from dashgen.runtime.varlen import (  # noqa: E402
    PackWorkspace, pack_tiles, plan_words)
from dashgen.runtime.select import PACK_AUTO_SCHEDULES, pack_workers, select_pack  # noqa: E402
from test_op_errors import fake_cuda, h200, on_cpu, qkv  # noqa: E402,F401  (fixtures by name)
from test_kernels_compile import MMA_SPILL_BYTES  # noqa: E402

BF16, FP16 = torch.bfloat16, torch.float16
ENTRY_REGISTERS = 168  # as in test_kernels_compile: setmaxnreg's cap at entry, 384 threads
SCHEDULER_SPILL_BYTES = 16  # as in test_kernels_compile: a named policy's walk may keep a few


def offsets(lengths):
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return cu


def pack(lengths_q=(2, 0, 3), lengths_k=None, heads_q=4, heads_kv=2, head_dim=64, dtype=BF16,
         device="cpu"):
    """(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of a pack; no data is
    read, so the tensors are empty (fake ones under FakeTensorMode with device="cuda")."""
    lengths_k = lengths_q if lengths_k is None else lengths_k
    cu_q, cu_k = offsets(lengths_q), offsets(lengths_k)
    q = torch.empty(cu_q[-1], heads_q, head_dim, dtype=dtype, device=device)
    k = torch.empty(cu_k[-1], heads_kv, head_dim, dtype=dtype, device=device)
    v = torch.empty(cu_k[-1], heads_kv, head_dim, dtype=dtype, device=device)
    if device == "cpu":
        cq, ck = (torch.tensor(c, dtype=torch.int32) for c in (cu_q, cu_k))
    else:  # on the GPU the offsets are never read on the host
        cq, ck = (torch.empty(len(c), dtype=torch.int32, device=device) for c in (cu_q, cu_k))
    return q, k, v, cq, ck, max(lengths_q, default=0), max(lengths_k, default=0)


def args_with(**changes):
    names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k")
    base = dict(zip(names, pack()))
    base.update(changes)
    return [base[n] for n in names]


# -- structural errors (CPU tensors: every host check runs before the device check) -------------

@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k"), (2, "v")])
def test_a_tensor_that_is_not_3d_is_named(position, name):
    args = list(pack())
    args[position] = args[position].unsqueeze(0)
    with pytest.raises(ValueError, match=rf"^{name} must be 3-D \(total_tokens, heads, head_dim\)"):
        check_varlen_inputs(*args)
    with pytest.raises(ValueError, match=rf"^{name} must be 3-D"):
        attention_varlen(*args)


@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k"), (2, "v")])
def test_a_non_tensor_is_named(position, name):
    args = list(pack())
    args[position] = [[[1.0]]]
    with pytest.raises(TypeError, match=rf"^{name} must be a torch.Tensor, got list"):
        check_varlen_inputs(*args)


@pytest.mark.parametrize("position, name", [(1, "k"), (2, "v")])
def test_mismatched_dtypes_name_the_odd_one(position, name):
    args = list(pack())
    args[position] = args[position].to(FP16)
    with pytest.raises(TypeError, match=rf"^{name} has dtype torch.float16 but q has "
                                        rf"torch.bfloat16"):
        attention_varlen(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_unsupported_dtype_names_q(dtype):
    with pytest.raises(TypeError, match=r"^q has dtype .*bfloat16 and torch.float16"):
        check_varlen_inputs(*pack(dtype=dtype))


@pytest.mark.parametrize("head_dim", [16, 72, 160, 320])
def test_an_unsupported_head_dim_names_q(head_dim):
    with pytest.raises(ValueError, match=rf"^q has head_dim {head_dim}; supported head_dims"):
        check_varlen_inputs(*pack(head_dim=head_dim))


def test_a_head_dim_mismatch_names_k():
    q, k, v, *rest = pack()
    with pytest.raises(ValueError, match=r"^k has head_dim 128 but q has head_dim 64"):
        check_varlen_inputs(q, torch.empty(5, 2, 128, dtype=BF16),
                            torch.empty(5, 2, 128, dtype=BF16), *rest)


def test_k_and_v_shapes_must_match():
    q, k, v, *rest = pack()
    with pytest.raises(ValueError, match=r"^v has shape \(5, 1, 64\) but k has shape \(5, 2, 64\)"):
        check_varlen_inputs(q, k, torch.empty(5, 1, 64, dtype=BF16), *rest)


def test_a_narrower_v_in_a_pack_passes_for_mha_only():
    """q/k 192 with v 128 in a pack: MHA passes every shape check; GQA and another width are
    refused by name."""
    q, k, _, *rest = pack(heads_q=4, heads_kv=4, head_dim=192)
    narrow = torch.empty(5, 4, 128, dtype=BF16)
    with pytest.raises(ValueError, match=r"^v has head_dim 64 but q and k have 192"):
        check_varlen_inputs(q, k, torch.empty(5, 4, 64, dtype=BF16), *rest)
    with pytest.raises(ValueError, match=r"^q, k and v are on cpu"):  # past every shape check
        check_varlen_inputs(q, k, narrow, *rest)
    q2, k2, _, *rest2 = pack(heads_q=4, heads_kv=2, head_dim=192)
    with pytest.raises(ValueError, match=r"as many k/v heads as q heads"):
        check_varlen_inputs(q2, k2, torch.empty(5, 2, 128, dtype=BF16), *rest2)


def test_heads_q_must_be_a_multiple_of_heads_kv():
    with pytest.raises(ValueError, match=r"^k has 3 heads, which does not divide q's 4 heads"):
        check_varlen_inputs(*pack(heads_q=4, heads_kv=3))


@pytest.mark.parametrize("position, name", [(0, "q"), (1, "k")])
def test_zero_heads_are_named(position, name):
    args = list(pack(heads_q=0 if position == 0 else 4, heads_kv=0 if position == 1 else 2))
    with pytest.raises(ValueError, match=rf"^{name} has 0 heads"):
        check_varlen_inputs(*args)


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("bad", [
    torch.tensor([0, 2, 2, 5], dtype=torch.int64),
    torch.tensor([[0, 2], [2, 5]], dtype=torch.int32),
    torch.tensor([0.0, 2.0, 2.0, 5.0]),
    torch.empty(0, dtype=torch.int32),
], ids=["int64", "2d", "float", "empty"])
def test_offsets_must_be_1d_int32(name, bad):
    with pytest.raises(ValueError, match=rf"^{name} must be a 1-D int32 tensor of batch \+ 1 "
                                         rf"offsets"):
        check_varlen_inputs(*args_with(**{name: bad}))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
def test_offsets_that_are_not_a_tensor_are_named(name):
    with pytest.raises(TypeError, match=rf"^{name} must be a torch.Tensor, got list"):
        check_varlen_inputs(*args_with(**{name: [0, 2, 2, 5]}))


def test_offsets_of_different_lengths_are_refused():
    # Both rise from 0 to 5 (so each alone passes), but they describe 3 and 2 sequences.
    cu_k = torch.tensor([0, 2, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q has 4 offsets but cu_seqlens_k has 3"):
        attention_varlen(*args_with(cu_seqlens_k=cu_k))


@pytest.mark.parametrize("name", ["max_seqlen_q", "max_seqlen_k"])
@pytest.mark.parametrize("value, error, pattern", [
    (-1, ValueError, r"must be >= 0, got -1"),
    (True, TypeError, r"must be an int, got True"),
    (False, TypeError, r"must be an int, got False"),
    (3.0, TypeError, r"must be an int, got 3.0"),
    (None, TypeError, r"must be an int, got None"),
])
def test_a_bad_max_seqlen_is_named(name, value, error, pattern):
    with pytest.raises(error, match=rf"^{name} {pattern}"):
        check_varlen_inputs(*args_with(**{name: value}))


@pytest.mark.parametrize("name", ["cu_seqlens_q", "cu_seqlens_k"])
@pytest.mark.parametrize("values", [
    [1, 2, 2, 5],  # does not start at 0
    [0, 3, 2, 5],  # a negative length
    [0, 2, 2, 4],  # ends short of the 5 packed tokens
    [0, 2, 2, 6],  # ends past them
], ids=["start", "falls", "short", "long"])
def test_cpu_offsets_must_rise_from_0_to_the_total(name, values):
    bad = torch.tensor(values, dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"^{name} must rise from 0 to 5 \(the packed tokens\), "
                                         rf"got \[{', '.join(map(str, values))}\]"):
        check_varlen_inputs(*args_with(**{name: bad}))


@pytest.mark.parametrize("name, limit", [("cu_seqlens_q", "max_seqlen_q"),
                                         ("cu_seqlens_k", "max_seqlen_k")])
def test_a_cpu_sequence_longer_than_max_seqlen_is_refused(name, limit):
    # The pack's longest sequence has 3 tokens.
    with pytest.raises(ValueError, match=rf"^{name}: a sequence of 3 tokens exceeds the "
                                         rf"max_seqlen given for it \(2\)"):
        attention_varlen(*args_with(**{limit: 2}))


def test_a_long_offset_list_is_shortened_in_the_message():
    lengths = [1] * 12
    q, k, v, cq, ck, mq, mk = pack(lengths)
    bad = torch.tensor(offsets(lengths)[:-1] + [99], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cu_seqlens_q must rise from 0 to 12 .*got "
                                         r"\[0, 1, 2, 3, 4, 5, 6, 7\]\.\.\.$"):
        check_varlen_inputs(q, k, v, bad, ck, mq, mk)


# -- option errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", ["table", "nope", "auto2", 3])
def test_a_schedule_no_pack_runs_is_named(schedule):
    with pytest.raises(ValueError, match=r"^schedule must be 'auto' or one of \('fa3', 'spt', "
                                         r"'descending', 'shift', 'symmetric_shift', 'hybrid'\) for a pack"):
        check_varlen_inputs(*pack(), schedule=schedule)


def test_pack_schedules_are_named_policies():
    assert "table" not in PACK_SCHEDULES and "auto" not in PACK_SCHEDULES
    # A listed schedule deals one fixed shape's units: a pack has its own deal.
    from dashgen.schedule.builders import BUILDERS
    assert set(PACK_SCHEDULES) == {name for name in SCHEDULE_POLICIES
                                   if name != "table" and not BUILDERS[name].listed}
    with pytest.raises(ValueError, match=r"^schedule must be 'auto' or one of"):
        select_pack("bf16", 128, True, "spt_listed")


@pytest.mark.parametrize("schedule, causal, pattern", [
    ("shift", True, r"^schedule='shift' serves the full mask; use 'symmetric_shift'"),
    ("symmetric_shift", False, r"^schedule='symmetric_shift' serves the causal mask; use 'shift'"),
])
def test_a_shift_schedule_for_the_other_mask_is_refused(schedule, causal, pattern):
    with pytest.raises(ValueError, match=pattern):
        attention_varlen(*pack(), causal=causal, schedule=schedule)


@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(causal=1), TypeError, r"^causal must be a bool"),
    (dict(softmax_scale=0.0), ValueError, r"^softmax_scale must be positive and finite"),
    (dict(softmax_scale=True), TypeError, r"^softmax_scale must be a float"),
    (dict(deterministic="yes"), TypeError, r"^deterministic must be a bool"),
    (dict(num_workers=0), ValueError, r"^num_workers must be positive"),
    (dict(num_workers=2.0), TypeError, r"^num_workers must be an int"),
    (dict(return_lse=1), TypeError, r"^return_lse must be a bool"),
])
def test_bad_options_are_named(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        attention_varlen(*pack(), **kwargs)


# -- the checks dashgen.attention and attention_varlen share ------------------------------------

def refusals(dense_args, packed_args, **kwargs):
    """The errors op.check_inputs and check_varlen_inputs raise for the same fault."""
    with pytest.raises(Exception) as dense:
        op.check_inputs(*dense_args, **kwargs)
    with pytest.raises(Exception) as packed:
        check_varlen_inputs(*packed_args, **kwargs)
    return dense.value, packed.value


@pytest.mark.parametrize("kwargs", [
    dict(causal=1), dict(causal="yes"), dict(softmax_scale=0.0), dict(softmax_scale=-0.1),
    dict(softmax_scale=math.inf), dict(softmax_scale="0.1"), dict(softmax_scale=True),
    dict(deterministic="yes"), dict(deterministic=1), dict(num_workers=0),
    dict(num_workers=1.5), dict(num_workers=True)])
def test_a_bad_option_gets_the_same_error_from_dense_and_packed_calls(kwargs):
    dense, packed = refusals(qkv(), pack(), **kwargs)
    assert type(dense) is type(packed) and str(dense) == str(packed)
    assert type(dense) in (TypeError, ValueError) and str(dense).startswith(next(iter(kwargs)))


@pytest.mark.parametrize("fault", ["float32 q", "fp16 k", "head_dim 72", "heads 4 / 3",
                                   "strided v", "on the cpu"])
def test_a_tensor_fault_gets_the_same_error_from_dense_and_packed_calls(fault):
    dense_args = list(qkv(device="cpu" if fault == "on the cpu" else "meta"))
    packed_args = list(pack())
    if fault == "float32 q":
        dense_args[0], packed_args[0] = dense_args[0].float(), packed_args[0].float()
    elif fault == "fp16 k":
        dense_args[1], packed_args[1] = dense_args[1].half(), packed_args[1].half()
    elif fault == "head_dim 72":
        dense_args[:3] = qkv(head_dim=72)
        packed_args[:3] = pack(head_dim=72)[:3]
    elif fault == "heads 4 / 3":
        dense_args[:3] = qkv(heads_q=4, heads_kv=3)
        packed_args[:3] = pack(heads_q=4, heads_kv=3)[:3]
    elif fault == "strided v":
        dense_args[2] = dense_args[2].transpose(-1, -2).contiguous().transpose(-1, -2)
        packed_args[2] = packed_args[2].transpose(-1, -2).contiguous().transpose(-1, -2)
    dense, packed = refusals(dense_args, packed_args)
    assert type(dense) is type(packed) and type(dense) in (TypeError, ValueError)
    if fault == "strided v":  # the strides themselves differ with the layouts
        assert str(dense).split(", got")[0] == str(packed).split(", got")[0]
    else:
        assert str(dense) == str(packed)


def test_deterministic_false_under_the_flag_gets_the_same_refusal(on_cpu):
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        dense, packed = refusals(qkv(device="cpu"), pack(), deterministic=False)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert type(dense) is type(packed) is RuntimeError and str(dense) == str(packed)


def test_both_ops_run_the_shared_checks(monkeypatch, on_cpu):
    """One implementation: replacing a shared check changes what both ops refuse."""
    class Refused(Exception):
        pass

    for name in ("options", "device", "dtype", "last_dim_contiguous"):
        def refuse(*args, _name=name):
            raise Refused(_name)
        with monkeypatch.context() as patch:
            patch.setattr(checks, name, refuse)
            dense, packed = refusals(qkv(device="cpu"), pack())
        assert (type(dense), str(dense)) == (type(packed), str(packed)) == (Refused, name)


# -- the device check and the resolved options --------------------------------------------------

def test_valid_cpu_tensors_reach_the_device_check():
    for call in (check_varlen_inputs, attention_varlen):
        with pytest.raises(ValueError, match=r"^q, k and v are on cpu; dashgen needs CUDA"):
            call(*pack(), causal=True, schedule="symmetric_shift")


def test_a_pack_of_empty_and_one_token_sequences_reaches_the_device_check():
    with pytest.raises(ValueError, match=r"CUDA"):
        attention_varlen(*pack((0, 1, 0), (1, 0, 3)))


def test_check_varlen_inputs_resolves_the_defaults(on_cpu):
    opts = check_varlen_inputs(*pack(head_dim=64), deterministic=True)
    assert opts == Options(causal=False, softmax_scale=1 / 8, deterministic=True,
                                 schedule="hybrid", num_workers=132)
    opts = check_varlen_inputs(*pack(head_dim=128), causal=True, softmax_scale=2,
                               deterministic=False, schedule="spt", num_workers=7)
    assert opts == Options(True, 2.0, False, "spt", 7)
    assert isinstance(opts.softmax_scale, float)
    assert check_varlen_inputs(*pack(head_dim=128)).softmax_scale == 1 / math.sqrt(128)


def test_more_workers_than_sms_is_refused(on_cpu):
    with pytest.raises(ValueError, match=r"^num_workers=133 exceeds this GPU's 132 SMs"):
        check_varlen_inputs(*pack(), num_workers=133)


@pytest.mark.parametrize("schedule, causal, least", [("shift", False, 16),
                                                    ("symmetric_shift", True, 8)])
def test_a_shift_schedule_needs_the_longest_sequences_units(on_cpu, schedule, causal, least):
    """2048 keys: 16 KV tiles of 128 (shift) or 8 pairs of them (symmetric_shift) at once."""
    q, k, v, cq, ck, mq, _ = pack()
    with pytest.raises(ValueError, match=rf"^schedule='{schedule}' needs {least} workers for a "
                                         rf"sequence of 2048 keys .* the {least - 1} this"):
        check_varlen_inputs(q, k, v, cq, ck, mq, 2048, causal=causal, schedule=schedule,
                            num_workers=least - 1)
    opts = check_varlen_inputs(q, k, v, cq, ck, mq, 2048, causal=causal, schedule=schedule,
                               num_workers=least)
    assert (opts.schedule, opts.num_workers) == (schedule, least)


def test_cpu_offsets_are_checked_on_the_host_for_cuda_tensors(h200):
    """Real CPU offsets with (fake) CUDA tensors: read on the host, so checked there."""
    good = torch.tensor(offsets((2, 0, 3)), dtype=torch.int32)
    bad = torch.tensor([0, 2, 1, 5], dtype=torch.int32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        q, k, v, *_ = pack(device="cuda")
        opts = check_varlen_inputs(q, k, v, good, good, 3, 3, deterministic=True)
        assert (opts.num_workers, opts.schedule) == (132, "hybrid")
        with pytest.raises(ValueError, match=r"^cu_seqlens_k must rise from 0 to 5"):
            check_varlen_inputs(q, k, v, good, bad, 3, 3)
        with pytest.raises(ValueError, match=r"^cu_seqlens_q: a sequence of 3 tokens exceeds"):
            check_varlen_inputs(q, k, v, good, good, 2, 3)


# -- pack_workers --------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, max_k, block_n, need", [
    ("shift", 2048, 128, 16), ("shift", 2049, 128, 17), ("shift", 1, 128, 1),
    ("symmetric_shift", 2048, 128, 8), ("symmetric_shift", 2049, 128, 9),
    ("symmetric_shift", 128 * 15, 128, 8), ("symmetric_shift", 100, 128, 1),
    ("shift", 1000, 64, 16),
])
def test_pack_workers_refuses_fewer_than_a_sequences_units(schedule, max_k, block_n, need):
    with pytest.raises(ValueError, match=rf"^schedule='{schedule}' needs {need} workers for a "
                                         rf"sequence of {max_k} keys"):
        pack_workers(schedule, max_k, block_n, need - 1, schedule != "shift")
    assert pack_workers(schedule, max_k, block_n, need, schedule != "shift") == need
    assert pack_workers(schedule, max_k, block_n, 132, schedule != "shift") == 132


@pytest.mark.parametrize("schedule", ["fa3", "spt", "descending"])
@pytest.mark.parametrize("workers", [1, 7, 132])
def test_pack_workers_of_independent_units_is_any_count(schedule, workers):
    for causal in (False, True):
        assert pack_workers(schedule, 100_000, 128, workers, causal) == workers


def test_pack_workers_of_a_pack_without_keys():
    assert pack_workers("shift", 0, 128, 1, False) == 1
    assert pack_workers("symmetric_shift", 0, 128, 1, True) == 1


# -- flash_attn_varlen_func ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, pattern", [
    (dict(dropout_p=0.1), r"^dropout_p: dashgen has no dropout, got 0.1"),
    (dict(alibi_slopes=torch.ones(4)), r"^alibi_slopes: dashgen has no ALiBi bias"),
    (dict(block_table=torch.zeros(3, 1, dtype=torch.int32)),
     r"^block_table: dashgen has no paged KV cache"),
])
def test_flash_attn_varlen_func_refuses_what_dashgen_cannot_do(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        flash_attn_varlen_func(*pack(), **kwargs)


def test_flash_attn_varlen_func_refuses_before_checking_the_tensors():
    # The tensors are wrong too (q 2-D): the refused argument is what the error names.
    q, *rest = pack()
    with pytest.raises(ValueError, match=r"^alibi_slopes: "):
        flash_attn_varlen_func(q[0], *rest, alibi_slopes=torch.ones(4))


@pytest.mark.parametrize("softcap, error, pattern", [
    (-1.0, ValueError, r"^softcap must be 0 \(no capping\) or a positive, finite cap, got -1.0$"),
    (float("inf"), ValueError, r"^softcap must be 0 "),
    ("50", TypeError, r"^softcap must be a float, got '50'$"),
    (True, TypeError, r"^softcap must be a float, got True$"),
])
def test_a_packs_softcap_is_checked(softcap, error, pattern):
    with pytest.raises(error, match=pattern):
        check_varlen_inputs(*pack(), softcap=softcap)


def test_flash_attn_varlen_func_takes_a_bool_return_attn_probs():
    with pytest.raises(TypeError, match=r"^return_attn_probs must be a bool"):
        flash_attn_varlen_func(*pack(), return_attn_probs="yes")


def test_flash_attn_varlen_func_hands_its_arguments_to_attention_varlen():
    # Defaults pass the refusals and reach attention_varlen's own checks.
    with pytest.raises(ValueError, match=r"^q, k and v are on cpu; dashgen needs CUDA"):
        flash_attn_varlen_func(*pack(), causal=True)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: a sequence of 3 tokens exceeds"):
        flash_attn_varlen_func(*pack()[:6], 2)
    with pytest.raises(ValueError, match=r"^softmax_scale must be positive"):
        flash_attn_varlen_func(*pack(), softmax_scale=-1.0)


# -- lse_by_head ---------------------------------------------------------------------------------

def kernel_layout(by_head, lengths):
    """The kernels' lse from a (heads, total) one, with explicit loops: sequence b's
    (heads, seqlen) block from heads * cu[b]."""
    heads = by_head.shape[0]
    cu = offsets(lengths)
    flat = torch.full((heads * cu[-1],), math.nan)
    for b, n in enumerate(lengths):
        for h in range(heads):
            for t in range(n):
                flat[heads * cu[b] + h * n + t] = by_head[h, cu[b] + t]
    return flat


def test_lse_by_head_by_hand():
    lengths, heads = (2, 0, 3), 2
    # (heads, total) as FlashAttention lays it out: 10 * head + token.
    want = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0], [10.0, 11.0, 12.0, 13.0, 14.0]])
    # The kernels': sequence 0 (h0 t0, h0 t1, h1 t0, h1 t1), then sequence 2's (2, 3) block.
    flat = torch.tensor([0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 4.0, 12.0, 13.0, 14.0])
    assert torch.equal(kernel_layout(want, lengths), flat)
    got = lse_by_head(flat, torch.tensor(offsets(lengths), dtype=torch.int32), heads)
    assert got.shape == (heads, 5) and got.dtype == torch.float32
    assert torch.equal(got, want)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 9), min_size=1, max_size=8), heads=st.integers(1, 4),
       seed=st.integers(0, 2**16))
def test_lse_by_head_is_flash_attentions_layout(lengths, heads, seed):
    total = sum(lengths)
    want = torch.randn(heads, total, generator=torch.Generator().manual_seed(seed))
    flat = kernel_layout(want, lengths)
    got = lse_by_head(flat, torch.tensor(offsets(lengths), dtype=torch.int32), heads)
    assert got.shape == (heads, total)
    assert torch.equal(got, want)


# -- the pack's buffers (params.cuh, PackedRows) ------------------------------------------------

def tile_slots(lengths, heads, block):
    """Each sequence's slots of a per-tile buffer: its (heads, tiles) block from
    heads * tile0(b), tile0(b) = (cu[b] + b * block) // block."""
    cu = offsets(lengths)
    slots = []
    for b, n in enumerate(lengths):
        tile0 = (cu[b] + b * block) // block
        tiles = -(-n // block)
        slots.append([heads * tile0 + h * tiles + m for h in range(heads) for m in range(tiles)])
    return slots


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.one_of(st.integers(0, 3), st.integers(0, 700),
                                  st.sampled_from([63, 64, 65, 127, 128, 129, 256])),
                        min_size=1, max_size=12),
       heads=st.integers(1, 5), block=st.sampled_from([64, 128]))
def test_packed_tiles_fit_the_buffer_and_never_overlap(lengths, heads, block):
    total, batch = sum(lengths), len(lengths)
    size = heads * pack_tiles(total, batch, block)
    seen = set()
    for n, mine in zip(lengths, tile_slots(lengths, heads, block)):
        assert len(mine) == heads * -(-n // block)
        assert all(0 <= s < size for s in mine), (lengths, heads, block)
        assert not seen & set(mine), (lengths, heads, block)
        seen |= set(mine)


def test_pack_tiles_by_hand():
    assert pack_tiles(0, 1, 128) == 1
    assert pack_tiles(255, 2, 128) == 3
    # Two sequences of 129 tokens: 2 tiles each, so 4 tiles; 258 // 128 + 2 = 4.
    assert pack_tiles(258, 2, 128) == 4
    assert tile_slots([129, 129], 1, 128) == [[0, 1], [2, 3]]
    assert tile_slots([1, 1, 1], 2, 64) == [[0, 1], [2, 3], [4, 5]]


def test_plan_words_is_the_plan_kernels_layout():
    """pack_plan.cuh: kPlanHeader (2) words, the sequence order (batch), six words per unit
    slot (unit_seq, unit_index, key, place, seq_of, index_of), then per sequence its tasks and
    place (batch each) and first_slot (batch + 1); then the tile maps, a word per tile."""
    for batch in (1, 3, 17):
        for units in (0, 1, 40):
            assert plan_words(batch, units) == 2 + batch + 6 * units + 2 * batch + batch + 1
            assert plan_words(batch, units, 5, 9) == plan_words(batch, units) + 14


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths_q=st.lists(st.integers(0, 600), min_size=1, max_size=8),
       data=st.data(), heads_kv=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([64, 128]), causal=st.booleans())
def test_pack_workspace_holds_every_sequences_tiles(lengths_q, data, heads_kv, group, head_dim,
                                                    causal):
    batch = len(lengths_q)
    lengths_k = data.draw(st.lists(st.integers(0, 600), min_size=batch, max_size=batch))
    heads_q, gqa = heads_kv * group, group > 1
    const = BACKWARD_CONSTANTS[head_dim, causal]
    bm, bn = const.block_m, const.block_n
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    ws = PackWorkspace(batch, total_q, total_k, heads_q, heads_kv, head_dim, bm, bn, gqa)
    parts = dict(zip(PackWorkspace.PARTS, ws.offsets))
    ends = ws.offsets[1:] + [ws.words]
    size = {name: end - start for name, start, end in zip(PackWorkspace.PARTS, ws.offsets, ends)}
    assert all(o % 4 == 0 for o in ws.offsets) and ws.words % 4 == 0  # 16-byte boundaries
    assert ws.offsets == sorted(ws.offsets) and ws.offsets[0] == 0
    assert ws.zeroed == parts["dk_accum"] and ws.words - ws.zeroed >= 0
    # The highest query / KV tile slot any sequence uses, +1.
    q_slots = max((s + 1 for seq in tile_slots(lengths_q, heads_q, bm) for s in seq), default=0)
    k_slots = max((s + 1 for seq in tile_slots(lengths_k, heads_kv, bn) for s in seq), default=0)
    assert size["dq_accum"] >= q_slots * bm * head_dim
    assert size["dq_counters"] >= q_slots
    assert size["dpsum"] >= heads_q * total_q  # a (heads_q, seqlen) block per sequence
    assert size["stats"] >= q_slots * 2 * bm
    if gqa:
        assert size["dk_accum"] >= k_slots * bn * head_dim
        assert size["dv_accum"] >= k_slots * bn * head_dim
        assert size["dkv_counters"] >= k_slots
    else:
        assert size["dk_accum"] == size["dv_accum"] == size["dkv_counters"] == 0
    # Every sequence's KV tiles find a unit slot in the plan.
    assert sum(-(-n // bn) for n in lengths_k) <= ws.max_units
    # And the tile maps after it: a head's packed query and key tiles, one word each.
    assert size["plan"] >= plan_words(batch, ws.max_units, pack_tiles(total_q, batch, bm),
                                      pack_tiles(total_k, batch, bn))
    assert ws.map_words == plan_words(batch, ws.max_units)
    assert (ws.q_tiles, ws.k_tiles) == (pack_tiles(total_q, batch, bm),
                                        pack_tiles(total_k, batch, bn))


# -- the varlen variants ------------------------------------------------------------------------

B, F = BackwardVariant, ForwardVariant


def test_a_varlen_forward_is_not_persistent():
    with pytest.raises(ValueError, match=r"^a varlen forward runs one CTA a query tile: "
                                         r"persistent=False"):
        F("bf16", 128, True, persistent=True, varlen=True)
    assert F("bf16", 128, True, persistent=True).persistent  # either alone is fine
    assert F("bf16", 128, True, varlen=True).varlen


@pytest.mark.parametrize("kwargs", [dict(schedule="table"),
                                    dict(schedule="fa3", fused_convert=True),
                                    dict(schedule="fa3", trace=True),
                                    dict(schedule="shift", trace=True, fused_convert=True)],
                         ids=["table", "fused_convert", "trace", "both"])
def test_a_varlen_backward_refuses_table_fused_convert_and_trace(kwargs):
    with pytest.raises(ValueError, match=r"^a varlen backward runs a named schedule without "
                                         r"fused_convert or trace"):
        B("bf16", 64, False, varlen=True, **kwargs)
    B("bf16", 64, False, **kwargs)  # the same variant without varlen exists


def test_varlen_must_be_a_bool():
    with pytest.raises(TypeError, match=r"^varlen must be a bool, got 1"):
        F("bf16", 64, False, varlen=1)
    with pytest.raises(TypeError, match=r"^varlen must be a bool, got 'yes'"):
        B("bf16", 64, False, "fa3", varlen="yes")


@pytest.mark.parametrize("variant, name", [
    (F("bf16", 128, True, varlen=True), "dashgen_fwd_bf16_d128_causal_varlen"),
    (F("fp16", 64, False, varlen=True), "dashgen_fwd_fp16_d64_full_varlen"),
    (B("bf16", 128, True, "fa3", varlen=True), "dashgen_bwd_bf16_d128_causal_fa3_det_varlen"),
    (B("bf16", 64, False, "shift", gqa=True, early_kv=True, varlen=True),
     "dashgen_bwd_bf16_d64_full_shift_det_gqa_ekv_varlen"),
    (B("fp16", 128, True, "symmetric_shift", deterministic=False, varlen=True),
     "dashgen_bwd_fp16_d128_causal_symshift_nondet_varlen"),
])
def test_varlen_kernel_names_end_in_varlen(variant, name):
    assert variant.kernel_name == name
    assert variant.kernel_name.endswith("_varlen")
    assert not dataclasses.replace(variant, varlen=False).kernel_name.endswith("_varlen")


@pytest.mark.parametrize("schedule", PACK_SCHEDULES)
def test_a_varlen_backward_source_walks_the_pack(schedule):
    variant = B("bf16", 128, schedule == "symmetric_shift", schedule, varlen=True)
    source = render_variant(variant)
    name = variant.kernel_name
    text = source.text
    assert source.name == name
    assert "{{" not in text and "{%" not in text
    assert '#include "dashgen/attn/pack_plan.cuh"' in text
    assert f"using Policy = sched::{variant.policy_class}<Tl>;" in text
    assert "sched::PackWalk<Policy<Tl>, Tl, Shape>" in text
    assert "static constexpr bool kVarlen = true;" in text
    for entry in (name, f"{name}_preprocess", f"{name}_convert", f"{name}_plan"):
        assert f"\n{entry}(" in text, entry
    fixed = render_variant(B("bf16", 128, schedule == "symmetric_shift", schedule)).text
    assert "PackWalk<" not in fixed and "_plan(" not in fixed
    assert "static constexpr bool kVarlen = false;" in fixed


def test_a_varlen_forward_source_runs_packed():
    variant = F("bf16", 64, True, varlen=True)
    text = render_variant(variant).text
    assert "Fwd::run_packed(" in text and "static constexpr bool kVarlen = true;" in text
    assert f"\n{variant.kernel_name}(" in text
    assert "Fwd::run_packed(" not in render_variant(F("bf16", 64, True)).text


# -- NVRTC builds (the slow tests) --------------------------------------------------------------

# What the runtime runs (dashgen.runtime.varlen.backward: early_kv=True by default).
COMPILED_BACKWARDS = [B("bf16", 128, True, "fa3", deterministic=True, early_kv=True, varlen=True),
                      B("bf16", 64, False, "shift", gqa=True, early_kv=True, varlen=True)]
COMPILED_FORWARD = F("bf16", 128, True, varlen=True)


@pytest.fixture(scope="module")
def compiled():
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = compile_kernel(render_variant(variant))
        return cache[variant]
    return get


@pytest.mark.parametrize("variant", COMPILED_BACKWARDS, ids=lambda v: v.kernel_name)
def test_compile_varlen_backward_has_its_four_kernels(variant, compiled):
    cubin = compiled(variant)
    name = variant.kernel_name
    assert cubin.data[:4] == b"\x7fELF"
    assert "--gpu-architecture=sm_90a" in cubin.options
    assert set(cubin.resources) == {name, f"{name}_preprocess", f"{name}_convert",
                                    f"{name}_plan"}, cubin.log
    assert cubin.resources[name].registers == ENTRY_REGISTERS, cubin.log
    for function in (f"{name}_preprocess", f"{name}_convert", f"{name}_plan"):
        assert cubin.resources[function].spill_bytes == 0, cubin.log
        assert cubin.resources[function].stack_frame_bytes == 0, cubin.log
    smem = cubin.constant(variant.smem_symbol)
    assert variant.block_m * variant.head_dim * 2 < smem <= SM90_MAX_SMEM_BYTES


SPILLS = ("the varlen shift backward (bf16 d64 full, GQA, early_kv) spills 24+24 bytes in its "
          "main kernel (24-byte stack frame; symmetric_shift 52+48), over the 16-byte bound "
          "tests/test_kernels_compile.py holds every fixed-length named walk to; the same "
          "variant without varlen spills 0")


@pytest.mark.parametrize("variant", [
    COMPILED_BACKWARDS[0],
    pytest.param(COMPILED_BACKWARDS[1], marks=pytest.mark.xfail(strict=True, reason=SPILLS)),
], ids=lambda v: v.kernel_name)
def test_compile_varlen_backward_spills_no_more_than_a_named_walk(variant, compiled):
    """The pack's walk runs in the scheduler lane like a fixed-length named policy's, in the
    producer warpgroup's 24 registers: the bound test_kernels_compile allows those."""
    main = compiled(variant).resources[variant.kernel_name]
    allowed = SCHEDULER_SPILL_BYTES + MMA_SPILL_BYTES[variant.head_dim]
    assert main.spill_bytes <= allowed, compiled(variant).log
    assert main.stack_frame_bytes <= allowed, compiled(variant).log


def test_compile_varlen_forward(compiled):
    cubin = compiled(COMPILED_FORWARD)
    name = COMPILED_FORWARD.kernel_name
    assert set(cubin.resources) == {name}, cubin.log
    assert cubin.resources[name].registers == ENTRY_REGISTERS, cubin.log
    assert cubin.resources[name].spill_bytes == 0, cubin.log
    assert 0 < cubin.constant(COMPILED_FORWARD.smem_symbol) <= SM90_MAX_SMEM_BYTES


# -- the custom ops' fake kernels ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_fake_varlen_forward_and_backward_shapes(fake_cuda, dtype):
    q, k, v, cq, ck, mq, mk = pack((5, 0, 9), (7, 3, 2), heads_q=8, heads_kv=2, dtype=dtype,
                                   device="cuda")
    o, lse = torch.ops.dashgen.attention_varlen_fwd(q, k, v, cq, ck, mq, mk, True, 0.125, True,
                                                    "fa3", 132)
    assert (o.shape, o.dtype, o.device.type) == (q.shape, dtype, "cuda")
    assert (lse.shape, lse.dtype, lse.device.type) == ((8 * 14,), torch.float32, "cuda")
    grads = torch.ops.dashgen.attention_varlen_bwd(torch.empty_like(o), q, k, v, o, lse, cq, ck,
                                                   mq, mk, True, 0.125, True, "fa3", 132)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, dtype) for t in (q, k, v)]


def test_fake_cuda_tensors_run_through_attention_varlen(fake_cuda):
    q, k, v, cq, ck, mq, mk = pack((5, 0, 9), (7, 3, 2), heads_q=8, heads_kv=2, device="cuda")
    o = attention_varlen(q, k, v, cq, ck, mq, mk, causal=True)
    assert (o.shape, o.dtype, o.device.type) == (q.shape, BF16, "cuda")
    o = attention_varlen(q, k, v, cq, ck, mq, mk, schedule="shift")
    assert o.shape == q.shape
    # return_lse=True is not taken here: lse_by_head slices cu_seqlens, and a CPU-only torch
    # cannot slice a fake CUDA tensor ("not linked with support for cuda devices").


class FakePackRuntime:
    """dashgen.runtime.varlen as recorders: o = 2 q, dq = 3 dO, through its forward and
    backward (the custom ops) or through the prepared calls it makes for a variant (the eager
    node's). `calls` says which ran: (forward or backward, the variant or None)."""

    def __init__(self):
        self.calls = []

    def forward(self, q, k, v, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale, softcap,
                window=(-1, -1)):
        self.calls.append(("forward", None))
        return self._forward(q)

    def backward(self, do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, *, causal, softmax_scale,
                 deterministic, schedule, workers, softcap, window=(-1, -1)):
        self.calls.append(("backward", None))
        return self._backward(do, k, v)

    def pack_forward_call(self, variant, q_shape, k_shape, batch, max_q, max_k, softmax_scale,
                          device, softcap, window=(-1, -1)):
        return lambda q, k, v, cu_q, cu_k: (self.calls.append(("forward", variant)),
                                             self._forward(q))[1]

    def pack_backward_call(self, variant, q_shape, k_shape, batch, max_q, max_k, softmax_scale,
                           deterministic, workers, device, softcap, window=(-1, -1)):
        return lambda do, q, k, v, o, lse, cu_q, cu_k: (self.calls.append(("backward", variant)),
                                                         self._backward(do, k, v))[1]

    @staticmethod
    def _forward(q):
        return q * 2, q.new_zeros(q.shape[0] * q.shape[1], dtype=torch.float32)

    @staticmethod
    def _backward(do, k, v):
        return do * 3, torch.zeros_like(k), torch.zeros_like(v)


def test_torch_compile_traces_a_pack_through_its_custom_ops(on_cpu, monkeypatch):
    """One graph for packs of other lengths (dynamic shapes), the eager call's results; the
    eager node runs the calls prepared for its selection's variants, the compiled graph's
    custom ops the runtime's forward and backward."""
    runtime = FakePackRuntime()
    monkeypatch.setattr(op_varlen, "_runtime", lambda: runtime)
    clear_caches()  # each round's eager call fills what the trace reads

    def call(q, k, v, cu, longest):
        return attention_varlen(q, k, v, cu, cu, longest, longest, causal=True,
                                deterministic=True)
    torch._dynamo.reset()
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True, dynamic=True)
    from torch._dynamo.utils import counters
    counters.clear()
    for lengths in ([300, 500, 7], [128, 1, 0, 900, 40], [64, 64]):
        q, k, v, cu, _, longest, _ = pack(lengths, heads_q=4, heads_kv=2, head_dim=128)
        leaves = [torch.randn_like(t).requires_grad_() for t in (q, k, v)]
        do = torch.randn_like(q)
        eager = call(*leaves, cu, longest)
        want = (eager, *torch.autograd.grad(eager, leaves, do))
        (_, forward), (_, backward) = runtime.calls
        assert forward.varlen and backward.varlen and backward.schedule == "hybrid"
        assert backward.gqa and backward.deterministic
        runtime.calls.clear()
        out = compiled(*leaves, cu, longest)
        got = (out, *torch.autograd.grad(out, leaves, do))
        assert runtime.calls == [("forward", None), ("backward", None)]
        runtime.calls.clear()
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    torch._dynamo.reset()


def test_a_pack_with_a_narrower_v_prepares_its_calls_in_vs_width(on_cpu, monkeypatch):
    """The eager node's prepared forward and backward are the pack selection's variants with
    head_dim_v (V's and dO's loads, dV's stores, O's width)."""
    runtime = FakePackRuntime()
    monkeypatch.setattr(op_varlen, "_runtime", lambda: runtime)
    clear_caches()
    q, k, _, cu, _, longest, _ = pack([300, 7], heads_q=4, heads_kv=4, head_dim=192)
    v = torch.empty(q.shape[0], 4, 128, dtype=BF16)
    leaves = [torch.randn_like(t).requires_grad_() for t in (q, k, v)]
    o = attention_varlen(*leaves, cu, cu, longest, longest, causal=True, deterministic=True)
    o.sum().backward()
    (_, forward), (_, backward) = runtime.calls
    assert forward.head_dim_v == backward.head_dim_v == 128
    assert backward.varlen and backward.kernel_name.startswith("dashgen_bwd_bf16_d192v128_causal")


@pytest.mark.parametrize("device", ["meta", "fake"])
def test_lse_by_head_without_data_is_heads_by_total(device):
    """What torch.compile traces: the (heads_q, total_q) shape from shapes alone."""
    if device == "meta":
        lse = torch.empty(8 * 14, device="meta")
        cu = torch.empty(4, dtype=torch.int32, device="meta")
        got = lse_by_head(lse, cu, 8)
    else:
        with FakeTensorMode():
            got = lse_by_head(torch.empty(8 * 14), torch.empty(4, dtype=torch.int32), 8)
    assert (got.shape, got.dtype) == ((8, 14), torch.float32)


def test_the_fake_ops_are_registered():
    assert hasattr(torch.ops.dashgen, "attention_varlen_fwd")
    assert hasattr(torch.ops.dashgen, "attention_varlen_bwd")
    assert set(PACK_AUTO_SCHEDULES.values()) <= set(PACK_SCHEDULES)


@pytest.mark.parametrize("causal, need", [(False, 64), (True, 32)])
def test_a_packs_auto_runs_on_a_fixed_worker_count_at_any_length(causal, need):
    """auto never falls back with the lengths (which would tie a sequence's bits to the longest
    other sequence of its pack): hybrid runs a sequence past 64 KV tiles on the ordered
    schedule, so 64 workers under a full mask and 32 under a causal one (fewer than any whole
    Hopper part's SMs) serve any pack; fewer are refused by name."""
    sel = select_pack("bf16", 128, causal, "auto")
    assert sel.schedule == PACK_AUTO_SCHEDULES[causal] == "hybrid"
    block_n = sel.backward.block_n
    assert pack_workers(sel.schedule, 1 << 20, block_n, need, causal) == need
    assert pack_workers(sel.schedule, 64 * block_n, block_n, need, causal) == need
    # Below the bound a pack needs its longest sequence's units only: 8 KV tiles.
    assert pack_workers(sel.schedule, 8 * block_n, block_n, 8 // (1 + causal), causal) \
        == 8 // (1 + causal)
    with pytest.raises(ValueError, match=rf"^schedule='hybrid' needs {need} workers"):
        pack_workers(sel.schedule, 1 << 20, block_n, need - 1, causal)
    with pytest.raises(ValueError, match=rf"^schedule='hybrid' needs {need} workers"):
        pack_workers(sel.schedule, 64 * block_n, block_n, need - 1, causal)


# -- dashgen emit --varlen -------------------------------------------------------------------------

def test_emit_varlen_writes_and_compiles_the_packed_pair(tmp_path, capsys):
    from dashgen.cli import main
    main(["emit", "--varlen", "--hdim", "64", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["dashgen_bwd_bf16_d64_causal_hybrid_det_ekv_varlen.cu",
                     "dashgen_bwd_bf16_d64_causal_hybrid_det_ekv_varlen.cubin",
                     "dashgen_fwd_bf16_d64_causal_varlen.cu",
                     "dashgen_fwd_bf16_d64_causal_varlen.cubin"]
    assert "dashgen_bwd_bf16_d64_causal_hybrid_det_ekv_varlen_plan " in out
    assert "PackWalk" in (tmp_path / names[0]).read_text()
    report = [line for line in out.splitlines() if not line.lstrip().startswith(("wrote", "and"))]
    assert all(len(line) <= 104 for line in report), out  # the paths aside, compiled or cached


def test_emit_varlen_takes_vs_width(tmp_path, capsys):
    """--hdim-v 128 under --hdim 192 (MLA) emits the packed pair at V's width; under GQA it is
    refused by name."""
    from dashgen.cli import main
    main(["emit", "--varlen", "--hdim", "192", "--hdim-v", "128", "--out", str(tmp_path)])
    capsys.readouterr()
    names = sorted(p.name for p in tmp_path.glob("*.cu"))
    assert names == ["dashgen_bwd_bf16_d192v128_causal_hybrid_det_ekv_varlen.cu",
                     "dashgen_fwd_bf16_d192v128_causal_varlen.cu"]
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--varlen", "--hdim", "192", "--hdim-v", "128", "--gqa",
              "--out", str(tmp_path / "gqa")])
    assert exit_.value.code == 2
    assert "runs without GQA" in capsys.readouterr().err


@pytest.mark.parametrize("argv, pattern", [
    (["--schedule", "symmetric_shift", "--mask", "full"], r"serves the causal mask"),
    (["--schedule", "shift", "--mask", "causal"], r"serves the full mask"),
    (["--seqlens", "100,200"], r"--varlen emits the packed kernels"),
    (["--hdim", "72"], r"--hdim must be one of"),
])
def test_emit_varlen_refusals_name_the_option(tmp_path, capsys, argv, pattern):
    from dashgen.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(["emit", "--varlen", "--out", str(tmp_path), *argv])
    assert exit_.value.code == 2
    assert re.search(pattern, capsys.readouterr().err)


# -- the checks a repeated signature skips, and the ones it does not ------------------------------

def test_a_repeated_signature_still_checks_its_cpu_offsets(on_cpu):
    q, k, v, cq, ck, mq, mk = pack((2, 0, 3))
    check_varlen_inputs(q, k, v, cq, ck, mq, mk)
    bad = torch.tensor([0, 4, 1, 5], dtype=torch.int32)  # the same shape, falling offsets
    with pytest.raises(ValueError, match=r"^cu_seqlens_q must rise from 0 to 5"):
        check_varlen_inputs(q, k, v, bad, ck, mq, mk)
    longer = torch.tensor([0, 0, 0, 5], dtype=torch.int32)  # one sequence of 5 > max_seqlen 3
    with pytest.raises(ValueError, match=r"a sequence of 5 tokens exceeds the max_seqlen"):
        check_varlen_inputs(q, k, v, longer, longer, mq, mk)


def test_a_repeated_signature_reads_the_deterministic_flag_each_call(on_cpu):
    args = pack()
    previous = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert check_varlen_inputs(*args).deterministic is False
        torch.use_deterministic_algorithms(True)
        assert check_varlen_inputs(*args).deterministic is True
        with pytest.raises(RuntimeError, match=r"deterministic=False"):
            check_varlen_inputs(*args, deterministic=False)
        with pytest.raises(RuntimeError, match=r"deterministic=False"):
            check_varlen_inputs(*args, deterministic=False)  # the second time too
    finally:
        torch.use_deterministic_algorithms(previous)


def test_a_max_seqlen_too_small_for_the_tokens_is_refused_without_reading_offsets(on_cpu):
    q, k, v, cq, ck, _, _ = pack((2, 0, 3))  # 5 tokens in 3 sequences
    with pytest.raises(ValueError, match=r"^max_seqlen_q=1: 3 sequences of at most 1 tokens "
                                         r"cannot hold the 5 packed tokens"):
        check_varlen_inputs(q, k, v, cq.to("meta"), ck.to("meta"), 1, 3)
    with pytest.raises(ValueError, match=r"^max_seqlen_k=0: "):
        check_varlen_inputs(q, k, v, cq.to("meta"), ck.to("meta"), 3, 0)


def test_more_sequences_than_a_grid_holds_are_refused_before_any_kernel(on_cpu):
    q, k, v, _, _, _, _ = pack((2, 0, 3))
    many = torch.empty(op_varlen.MAX_SEQUENCES + 2, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"^cu_seqlens_q: 65536 sequences; the packed kernels "
                                         r"take at most 65535"):
        check_varlen_inputs(q, k, v, many, many, 3, 3)


def test_a_window_in_a_pack_reaches_the_window_kernels(on_cpu, monkeypatch):
    """A window that removes no key of the longest sequence runs the plain kernels; one that
    removes keys, the pack's window variants (spt by default) with the bounds."""
    runtime = FakePackRuntime()
    monkeypatch.setattr(op_varlen, "_runtime", lambda: runtime)
    clear_caches()
    q, k, v, cu, _, longest, _ = pack([300, 500, 7], heads_q=4, heads_kv=2, head_dim=128)
    attention_varlen(q, k, v, cu, cu, longest, longest, window_size=(longest, 0))  # causal
    (_, forward), = runtime.calls
    assert not forward.window and forward.causal
    runtime.calls.clear()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = attention_varlen(*leaves, cu, cu, longest, longest, window_size=(63, 0),
                         deterministic=True)
    o.sum().backward()
    (_, forward), (_, backward) = runtime.calls
    assert forward.window and backward.window and backward.varlen
    assert backward.schedule == "spt" and not backward.causal
    with pytest.raises(ValueError, match=r"^schedule must be 'auto' or one of \('spt', 'fa3', "
                                         r"'descending'\) for a pack under a sliding window"):
        attention_varlen(q, k, v, cu, cu, longest, longest, window_size=(63, 0),
                         schedule="hybrid")
