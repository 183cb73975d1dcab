"""Which kernel the runtime picks, and the tiles its schedules are built with (no GPU needed:
the choice reads only dtype and shape)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen.runtime import backward as runtime# noqa: E402
from dashgen.codegen.variants import Sm90BwdConfig, Sm90FwdConfig  # noqa: E402


def tensors(head_dim=128, heads_q=4, heads_kv=4, dtype=torch.bfloat16):
    q = torch.empty(1, 100, heads_q, head_dim, dtype=dtype)
    k = torch.empty(1, 100, heads_kv, head_dim, dtype=dtype)
    return q, k


@pytest.mark.parametrize("head_dim,heads_kv,dtype,expect", [
    (128, 4, torch.bfloat16, "sm90"),
    (128, 1, torch.bfloat16, "sm90"),   # GQA/MQA: ordered dK/dV adds
    (64, 4, torch.bfloat16, "sm90"),    # head_dim 64: dQ split by KV rows
    (64, 2, torch.bfloat16, "sm90"),
    (128, 4, torch.float16, "sm90"),    # fp16: f16 wgmma inputs
    (64, 1, torch.float16, "sm90"),
])
def test_auto_picks_the_hopper_kernels_where_they_serve(head_dim, heads_kv, dtype, expect):
    q, k = tensors(head_dim, 4, heads_kv, dtype)
    assert runtime.backward_kernel(q, k) == expect
    assert runtime.forward_kernel(q) == expect


def test_schedules_use_the_tiles_of_the_kernel_that_runs():
    q, k = tensors()
    assert (runtime.problem_of(q, k, True).block_m, runtime.problem_of(q, k, True).block_n) == \
        Sm90BwdConfig.blocks_for(128) == (64, 128)
    q64, k64 = tensors(head_dim=64)
    p64 = runtime.problem_of(q64, k64, True)
    assert (p64.block_m, p64.block_n) == Sm90BwdConfig.blocks_for(64) == (128, 128)
    mma = runtime.problem_of(q, k, True, kernel="mma")
    assert (mma.block_m, mma.block_n) == (64, 64)
    cfg = runtime.KernelConfig.for_problem(128, "bf16", False)
    assert (cfg.block_m, cfg.block_n) == (64, 128)
    cfg = runtime.KernelConfig.for_problem(64, "bf16", False)
    assert (cfg.block_m, cfg.block_n) == (128, 128)


@pytest.mark.parametrize("kernel,args,match", [
    ("sm90", dict(head_dim=96), "head_dim 64 or 128"),
    ("tensor-cores", dict(), "kernel must be"),
])
def test_explicit_kernel_choices_are_checked(kernel, args, match):
    q, k = tensors(**args)
    with pytest.raises(ValueError, match=match):
        runtime.backward_kernel(q, k, kernel)
    with pytest.raises(ValueError, match=match):
        runtime.forward_kernel(q, kernel)


def test_the_mma_kernels_can_be_asked_for_explicitly():
    q, k = tensors(head_dim=64, heads_q=8, heads_kv=2)
    assert runtime.backward_kernel(q, k, "mma") == "mma"
    assert runtime.forward_kernel(q, "mma") == "mma"
    assert runtime.problem_of(q, k, False, kernel="mma").block_n == 64
    q16, k16 = tensors(dtype=torch.float16)
    assert runtime.backward_kernel(q16, k16, "mma") == "mma"
    assert runtime.forward_kernel(q16, "mma") == "mma"
    assert Sm90BwdConfig.serves("fp16", 128, False) and Sm90FwdConfig.serves("fp16", 128)
