"""Which kernel the runtime picks, and the tiles its schedules are built with (no GPU needed:
the choice reads only dtype and shape)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen import runtime  # noqa: E402
from dashgen.kernels import Sm90BwdConfig, Sm90FwdConfig  # noqa: E402


def tensors(head_dim=128, heads_q=4, heads_kv=4, dtype=torch.bfloat16):
    q = torch.empty(1, 100, heads_q, head_dim, dtype=dtype)
    k = torch.empty(1, 100, heads_kv, head_dim, dtype=dtype)
    return q, k


@pytest.mark.parametrize("head_dim,heads_kv,dtype,expect", [
    (128, 4, torch.bfloat16, "sm90"),   # checked on an H200: the default
    (128, 1, torch.bfloat16, "mma"),    # GQA: the Hopper variant has not run on a GPU yet
    (64, 4, torch.bfloat16, "mma"),     # head_dim 64: likewise
    (128, 4, torch.float16, "mma"),     # fp16: no Hopper path
])
def test_auto_picks_only_kernels_that_ran_on_a_gpu(head_dim, heads_kv, dtype, expect):
    q, k = tensors(head_dim, 4, heads_kv, dtype)
    assert runtime.backward_kernel(q, k) == expect
    assert runtime.forward_kernel(q) == "mma"


def test_schedules_use_the_tiles_of_the_kernel_that_runs():
    q, k = tensors()
    assert (runtime.problem_of(q, k, True).block_m, runtime.problem_of(q, k, True).block_n) == \
        (Sm90BwdConfig.block_m, Sm90BwdConfig.block_n)
    mma = runtime.problem_of(q, k, True, kernel="mma")
    assert (mma.block_m, mma.block_n) == (64, 64)
    cfg = runtime.KernelConfig.for_problem(128, "bf16", False)
    assert (cfg.block_m, cfg.block_n) == (64, 128)


@pytest.mark.parametrize("kernel,args,match", [
    ("sm90", dict(head_dim=128, dtype=torch.float16), "bf16"),
    ("tensor-cores", dict(), "kernel must be"),
])
def test_explicit_kernel_choices_are_checked(kernel, args, match):
    q, k = tensors(**args)
    with pytest.raises(ValueError, match=match):
        runtime.backward_kernel(q, k, kernel)
    with pytest.raises(ValueError, match=match):
        runtime.forward_kernel(q, kernel)


def test_staged_hopper_variants_can_be_asked_for_explicitly():
    q, k = tensors(head_dim=64, heads_q=8, heads_kv=2)
    assert runtime.backward_kernel(q, k, "sm90") == "sm90"
    assert runtime.forward_kernel(q, "sm90") == "sm90"
    assert Sm90BwdConfig.supports("bf16", 64, True) and not Sm90BwdConfig.serves("bf16", 64, True)
    assert Sm90FwdConfig.supports("bf16", 64) and not Sm90FwdConfig.serves("bf16", 64)
