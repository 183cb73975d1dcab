"""A head_dim the runtime does not serve (160 and 224: no kernel) is refused wherever users
reach dashgen (dashgen.attention, attention_varlen, sdpa and its flash registration, the
runtime's selection), each with the same error, before any kernel runs; flash_attn's functions
pad it into a served one as flash_attn does, up to 256. The driver boundary is faked as in
test_op_errors (op._kernels), so a call that got through would be recorded."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import dashgen  # noqa: E402
from dashgen.codegen.variants import (BACKWARD_BUILT_HEAD_DIMS, FORWARD_HEAD_DIMS,  # noqa: E402
                                      HEAD_DIMS, ForwardVariant, served_head_dims)
from dashgen.interfaces import sdpa as sdpa_mod  # noqa: E402
from dashgen.runtime.op_varlen import check_varlen_inputs  # noqa: E402
from dashgen.runtime.select import (Plan, problem_for, select_forward,  # noqa: E402
                                    select_pack)
from dashgen.schedule.problem import Problem  # noqa: E402
from test_op_errors import cpu_leaves, h200, kernels, on_cpu  # noqa: E402,F401  (fixtures)
from test_varlen import pack  # noqa: E402

UNSERVED = [160, 224]
SERVED = r"\(32, 48, 64, 80, 96, 112, 128, 192, 256\)"
REFUSED = rf"^q has head_dim {{}}; supported head_dims: {SERVED}$"
NO_KERNEL = rf"^head_dim must be one of {SERVED}, got {{}}$"


def test_the_forward_compiles_for_the_served_head_dims_and_the_built_ones():
    """HEAD_DIMS are served, the padded ones (32, 48, 80, 112) among them since their GPU tests
    passed; BACKWARD_BUILT_HEAD_DIMS (none today) would compile, forward and backward, and stay
    refused until their GPU tests open them."""
    assert HEAD_DIMS == (32, 48, 64, 80, 96, 112, 128, 192, 256)
    assert FORWARD_HEAD_DIMS == tuple(sorted(HEAD_DIMS + BACKWARD_BUILT_HEAD_DIMS))
    assert BACKWARD_BUILT_HEAD_DIMS == () and served_head_dims() == HEAD_DIMS
    assert all(ForwardVariant("bf16", d, False).head_dim == d for d in FORWARD_HEAD_DIMS)


@pytest.mark.parametrize("head_dim", UNSERVED)
def test_attention_and_sdpa_refuse_them(on_cpu, kernels, head_dim):
    q, k, v = cpu_leaves(head_dim=head_dim)
    with pytest.raises(ValueError, match=REFUSED.format(head_dim)):
        dashgen.attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match=REFUSED.format(head_dim)):
        dashgen.sdpa(*(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True)
    with pytest.raises(RuntimeError, match=rf"\(forward\): q has head_dim {head_dim}"):
        sdpa_mod._flash_forward(*(t.detach().transpose(1, 2) for t in (q, q, q)))
    assert kernels.calls == []


@pytest.mark.parametrize("head_dim", UNSERVED)
def test_flash_attn_func_pads_them_up_to_256_and_refuses_wider(on_cpu, kernels, head_dim):
    """flash_attn_func takes any head_dim up to 256, as flash_attn does: zero-padded into the
    next served one (interfaces.flash_attn.run_padded), with its own width's scale; past 256 it
    refuses as attention does."""
    q, k, v = cpu_leaves(head_dim=head_dim)
    out = dashgen.flash_attn_func(q, k, v)
    assert out.shape == q.shape
    assert ("forward", dict(causal=False, softmax_scale=head_dim ** -0.5)) in kernels.calls
    with pytest.raises(ValueError, match=REFUSED.format(320)):
        dashgen.flash_attn_func(*cpu_leaves(head_dim=320))


@pytest.mark.parametrize("head_dim", UNSERVED)
def test_attention_varlen_refuses_them(on_cpu, kernels, head_dim):
    args = pack(head_dim=head_dim)
    with pytest.raises(ValueError, match=REFUSED.format(head_dim)):
        check_varlen_inputs(*args)
    with pytest.raises(ValueError, match=REFUSED.format(head_dim)):
        dashgen.attention_varlen(*args, causal=True)
    assert kernels.calls == []


@pytest.mark.parametrize("head_dim", UNSERVED)
def test_the_runtimes_selection_refuses_them(head_dim):
    """select asks check_dtype_head_dim with the runtime's HEAD_DIMS."""
    problem = Problem(batch=1, heads_q=2, seqlen_q=256, head_dim=head_dim)
    with pytest.raises(ValueError, match=NO_KERNEL.format(head_dim)):
        select_forward(problem, "bf16")
    with pytest.raises(ValueError, match=NO_KERNEL.format(head_dim)):
        Plan(problem, "bf16")
    with pytest.raises(ValueError, match=NO_KERNEL.format(head_dim)):
        select_pack("bf16", head_dim, False, "auto")
    with pytest.raises(ValueError, match=NO_KERNEL.format(head_dim)):
        problem_for(1, 2, 2, 256, 256, head_dim, False)
