"""dashgen.attention on a CPU: every input error names its argument before any kernel runs, the
resolved Options, deterministic=None following torch, and the autograd / custom-op /
torch.compile wiring. Only the driver boundary is faked: op._kernels() hands out recording
stand-ins for runtime.forward, runtime.backward, runtime.BackwardCall and the runtime's prepared
calls (forward_call, backward_launch) that return tensors shaped as the runtime's."""
from __future__ import annotations

import inspect
import math
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from dashgen.caches import clear_caches  # noqa: E402
from dashgen.runtime import checks, op  # noqa: E402

BF16 = torch.bfloat16


# -- the faked driver boundary -------------------------------------------------------------------

def fake_gradients(do, q, k, v):
    """dq = 2 dO, dk = 3, dv = 5: which gradient reached which input is plain to see. Where v
    (so dO) is narrower than q (MLA), dq's columns past dO's are 7."""
    dq = (do.float() * 2).to(q.dtype)
    if do.shape[-1] < q.shape[-1]:
        dq = torch.cat((dq, torch.full_like(q[..., do.shape[-1]:], 7.0)), -1)
    return dq, torch.full_like(k, 3.0), torch.full_like(v, 5.0)


class FakeKernels:
    """op._kernels()'s (forward, backward, BackwardCall, forward_call, backward_launch),
    recording what the op hands them. Outputs are fresh contiguous tensors of the runtime's
    shapes and a fixed function of the inputs, so that two paths through the op can be compared
    bitwise."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.prepared: list[tuple[int, ...]] = []  # the pointers each BackwardCall was built for
        self.launches: list = []  # the launch each BackwardCall was handed (or None)
        self.forward_calls: list[tuple] = []  # the signatures of the forward calls made
        self.backward_launches: list[FakeLaunch] = []  # the backward launches made

    @staticmethod
    def _check_ready(*tensors):
        for t in tensors:
            assert t.is_contiguous() and t.data_ptr() % 16 == 0, "the op hands over ready tensors"

    @staticmethod
    def _options(softcap, window=(-1, -1), **options):
        """The options recorded: softcap and window only where asked for."""
        return {**options, **({"softcap": softcap} if softcap else {}),
                **({"window": tuple(window)} if tuple(window) != (-1, -1) else {})}

    def forward(self, q, k, v, *, causal, softmax_scale, softcap=0.0, window=(-1, -1)):
        self._check_ready(q, k, v)
        self.calls.append(("forward", self._options(softcap, window, causal=causal,
                                                    softmax_scale=softmax_scale)))
        q_part = q.float()[..., :v.shape[-1]]  # o has v's width (q/k 192, v 128: MLA)
        o = (q_part * softmax_scale + float(causal) + v.float().mean() + softcap).to(q.dtype)
        lse = q.float().sum(-1).transpose(1, 2).contiguous()  # (batch, heads_q, seqlen_q)
        return o, lse

    def backward(self, do, q, k, v, o, lse, *, causal, softmax_scale, deterministic, schedule,
                 num_workers, softcap=0.0, window=(-1, -1)):
        self._check_ready(do, q, k, v, o)
        assert lse.is_contiguous()
        self.calls.append(("backward", self._options(
            softcap, window, causal=causal, softmax_scale=softmax_scale, deterministic=deterministic,
            schedule=schedule, num_workers=num_workers)))
        return fake_gradients(do, q, k, v)

    def BackwardCall(self, q, k, v, o, lse, *, launch=None, softcap=0.0,  # noqa: N802
                     window=(-1, -1), **options):
        self._check_ready(q, k, v, o)
        self.prepared.append(tuple(t.data_ptr() for t in (q, k, v, o, lse)))
        self.launches.append(launch)
        self.calls.append(("prepare", self._options(softcap, window, **options)))
        return FakeCall(self, (q, k, v, o, lse))

    def forward_call(self, q_shape, k_shape, dtype, causal, softmax_scale, device, overrides,
                     softcap=0.0, window=(-1, -1), head_dim_v=None):
        self.forward_calls.append((q_shape, k_shape, dtype, causal, softmax_scale, device,
                                   overrides))
        return lambda q, k, v: self.forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                            softcap=softcap, window=window)

    def backward_launch(self, selection, device):
        self.backward_launches.append(FakeLaunch(selection, device))
        return self.backward_launches[-1]


class FakeLaunch:
    """runtime.BackwardLaunch as the op holds it: made for a selection, sized by its tables."""

    def __init__(self, selection, device):
        self.selection, self.device = selection, device

    def device_bytes(self):
        return 0


class FakeCall:
    """runtime.BackwardCall's contract: serves(), then __call__(do)."""

    def __init__(self, kernels, tensors):
        self.kernels = kernels
        self.pointers = tuple(t.data_ptr() for t in tensors)
        self.q, self.k, self.v = tensors[:3]

    def serves(self, q, k, v, o, lse):
        return tuple(t.data_ptr() for t in (q, k, v, o, lse)) == self.pointers

    def __call__(self, do):
        FakeKernels._check_ready(do)
        self.kernels.calls.append(("call", dict(do=do.data_ptr())))
        return fake_gradients(do, self.q, self.k, self.v)


@pytest.fixture(autouse=True)
def kernels(monkeypatch):
    fake = FakeKernels()
    monkeypatch.setattr(op, "_kernels", lambda: fake)
    clear_caches()  # the tests change what the device reports between calls
    yield fake
    clear_caches()


@pytest.fixture
def varlen(monkeypatch):
    """dashgen.attention_varlen replaced by attention per document in float32 (causal where
    asked; the packed kernels need a GPU): records each call's shapes, offsets, longest
    documents and causality."""
    from dashgen.runtime import op_varlen
    calls = []

    def fake(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, softmax_scale=None, **options):
        calls.append(dict(q=tuple(q.shape), k=tuple(k.shape), cu_q=cu_q.tolist(),
                          cu_k=cu_k.tolist(), max_q=max_q, max_k=max_k, causal=causal))
        if tuple(options.get("window_size", (-1, -1))) != (-1, -1):
            calls[-1]["window_size"] = tuple(options["window_size"])
        group = q.shape[1] // k.shape[1]
        out = []
        for (a, b), (c, d) in zip(zip(cu_q.tolist(), cu_q.tolist()[1:]),
                                  zip(cu_k.tolist(), cu_k.tolist()[1:])):
            qs, ks, vs = (t.float().transpose(0, 1) for t in (q[a:b], k[c:d], v[c:d]))
            o = torch.nn.functional.scaled_dot_product_attention(
                qs, ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0),
                is_causal=causal, scale=softmax_scale)
            out.append(o.transpose(0, 1).to(q.dtype))
        if options.get("return_lse"):  # lse is not computed here
            return torch.cat(out), None
        return torch.cat(out)

    monkeypatch.setattr(op_varlen, "attention_varlen", fake)
    return calls


@pytest.fixture
def h200(monkeypatch):
    """Device queries answer like an H200 (132 SMs)."""
    monkeypatch.setattr(checks, "_device_facts", lambda index: (9, 0, 132, "NVIDIA H200"))


@pytest.fixture
def on_cpu(monkeypatch, h200):
    """Let the op take CPU tensors, so its autograd and compile wiring run here."""
    monkeypatch.setattr(checks, "_DEVICE_TYPE", "cpu")


@pytest.fixture
def fake_cuda(h200):
    """Fake CUDA tensors (shapes, dtypes, devices, no data): reach the device checks on a CPU."""
    with FakeTensorMode():
        yield


@pytest.fixture
def restore_determinism():
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def meta(*shape, dtype=BF16):
    return torch.empty(*shape, dtype=dtype, device="meta")


def qkv(batch=2, seqlen_q=100, seqlen_k=70, heads_q=8, heads_kv=2, head_dim=64, dtype=BF16,
        device="meta"):
    make = (lambda *s: torch.randn(*s, dtype=dtype, device=device)) if device != "meta" else \
        (lambda *s: torch.empty(*s, dtype=dtype, device=device))
    return (make(batch, seqlen_q, heads_q, head_dim), make(batch, seqlen_k, heads_kv, head_dim),
            make(batch, seqlen_k, heads_kv, head_dim))


def cpu_leaves(seed=0, **shape):
    torch.manual_seed(seed)
    return tuple(t.requires_grad_() for t in qkv(device="cpu", **shape))


# -- structural errors (meta tensors) ------------------------------------------------------------

@pytest.mark.parametrize("position", [0, 1, 2])
def test_non_tensor_is_named(position):
    args = list(qkv())
    args[position] = [[1.0]]
    with pytest.raises(TypeError, match=rf"^{'qkv'[position]} must be a torch.Tensor"):
        op.check_inputs(*args)


@pytest.mark.parametrize("position", [0, 1, 2])
def test_wrong_rank_is_named(position):
    args = list(qkv())
    args[position] = args[position][0]
    with pytest.raises(ValueError, match=rf"^{'qkv'[position]} must be 4-D"):
        op.check_inputs(*args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8])
def test_unsupported_dtype_names_q(dtype):
    with pytest.raises(TypeError, match=r"^q has dtype"):
        op.check_inputs(*qkv(dtype=dtype))


@pytest.mark.parametrize("position", [1, 2])
def test_mixed_dtypes_name_the_odd_one(position):
    args = list(qkv())
    args[position] = args[position].to(torch.float16)
    with pytest.raises(TypeError, match=rf"^{'qkv'[position]} has dtype"):
        op.check_inputs(*args)


@pytest.mark.parametrize("position, dim, word", [
    (0, 1, "seqlen"), (1, 1, "seqlen"), (0, 0, "batch"), (0, 2, "heads"), (2, 2, "heads")])
def test_zero_sizes_are_named(position, dim, word):
    args = list(qkv())
    shape = list(args[position].shape)
    shape[dim] = 0
    args[position] = meta(*shape)
    with pytest.raises(ValueError, match=rf"^{'qkv'[position]} has {word} 0"):
        op.check_inputs(*args)


def test_batch_mismatch_names_k():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"^k has batch 3 but q has batch 2"):
        op.check_inputs(q, meta(3, 70, 2, 64), meta(3, 70, 2, 64))


@pytest.mark.parametrize("position", [1, 2])
def test_head_dim_mismatch_is_named(position):
    args = list(qkv())
    args[position] = meta(2, 70, 2, 128)
    with pytest.raises(ValueError, match=rf"^{'qkv'[position]} has head_dim 128 but q"):
        op.check_inputs(*args)


def test_k_and_v_shapes_must_match():
    q, k, _ = qkv()
    with pytest.raises(ValueError, match=r"^v has shape .* but k has shape"):
        op.check_inputs(q, k, meta(2, 71, 2, 64))


def test_a_narrower_v_is_served_only_as_mla_without_grouped_heads():
    """q/k 192 with v 128 (HEAD_DIM_V_PAIRS) passes the shape checks; another width, or the
    pair under GQA, is refused naming v."""
    q, k = meta(2, 100, 8, 192), meta(2, 70, 8, 192)
    with pytest.raises(ValueError, match=r"needs CUDA tensors"):  # past every shape check
        op.check_inputs(q, k, meta(2, 70, 8, 128))
    with pytest.raises(ValueError, match=r"^v has head_dim 64 but q and k have 192.*192/128"):
        op.check_inputs(q, k, meta(2, 70, 8, 64))
    with pytest.raises(ValueError, match=r"^v has head_dim 128 under q's 192: .*GQA"):
        op.check_inputs(q, meta(2, 70, 2, 192), meta(2, 70, 2, 128))


def test_the_eager_node_prepares_the_backward_with_vs_width(on_cpu, kernels):
    """The prepared backward's kernels are V's width: the launch the node hands over is the
    selection's with head_dim_v (the kernels' loads of V and dO, dV's stores)."""
    torch.manual_seed(0)
    q, k = (torch.randn(1, 64, 4, 192, dtype=BF16, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 64, 4, 128, dtype=BF16, requires_grad=True)
    op.attention(q, k, v, causal=True).sum().backward()
    (launch,) = kernels.backward_launches
    assert launch.selection.backward.head_dim_v == 128
    assert launch.selection.forward.head_dim_v == 128
    assert launch.selection.backward.kernel_name.startswith("dashgen_bwd_bf16_d192v128_causal")
    assert v.grad.shape == v.shape


def test_heads_q_must_be_a_multiple_of_heads_kv():
    q, _, _ = qkv(heads_q=8)
    with pytest.raises(ValueError, match=r"^k has 3 heads"):
        op.check_inputs(q, meta(2, 70, 3, 64), meta(2, 70, 3, 64))


@pytest.mark.parametrize("head_dim", [16, 72, 160, 320])
def test_unsupported_head_dim_names_q(head_dim):
    with pytest.raises(ValueError, match=r"^q has head_dim .*supported head_dims"):
        op.check_inputs(*qkv(head_dim=head_dim))


@pytest.mark.parametrize("position", [0, 1, 2])
def test_strided_last_dim_is_rejected(position):
    args = list(qkv())
    b, s, h, d = args[position].shape
    args[position] = meta(b, d, h, s).permute(0, 3, 2, 1)  # right shape, stride(-1) != 1
    with pytest.raises(ValueError, match=rf"^{'qkv'[position]} must be contiguous in its last"):
        op.check_inputs(*args)


# -- option errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, pattern", [
    (dict(causal=1), TypeError, r"^causal must be a bool"),
    (dict(causal="yes"), TypeError, r"^causal must be a bool"),
    (dict(softmax_scale=0.0), ValueError, r"^softmax_scale must be positive and finite"),
    (dict(softmax_scale=-0.1), ValueError, r"^softmax_scale must be positive and finite"),
    (dict(softmax_scale=math.inf), ValueError, r"^softmax_scale must be positive and finite"),
    (dict(softmax_scale=math.nan), ValueError, r"^softmax_scale must be positive and finite"),
    (dict(softmax_scale="0.1"), TypeError, r"^softmax_scale must be a float"),
    (dict(softmax_scale=True), TypeError, r"^softmax_scale must be a float"),
    (dict(deterministic="yes"), TypeError, r"^deterministic must be a bool"),
    (dict(schedule=3), TypeError, r"^schedule must be a str"),
    (dict(schedule="fastest"), ValueError, r"^schedule: unknown schedule 'fastest'.*'auto'"),
    (dict(num_workers=0), ValueError, r"^num_workers must be positive"),
    (dict(num_workers=1.5), TypeError, r"^num_workers must be an int"),
    (dict(num_workers=True), TypeError, r"^num_workers must be an int"),
])
def test_bad_options_are_named(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        op.check_inputs(*qkv(), **kwargs)


# -- device errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("position", [1, 2])
def test_tensors_on_different_devices_name_the_odd_one(position):
    args = list(qkv())
    args[position] = torch.empty(args[position].shape, dtype=BF16)
    with pytest.raises(ValueError, match=rf"^{'qkv'[position]} is on cpu but q is on meta"):
        op.check_inputs(*args)


def test_cpu_tensors_are_rejected_before_any_kernel(kernels):
    q, k, v = qkv(device="cpu")
    with pytest.raises(ValueError, match=r"^q, k and v are on cpu; dashgen needs CUDA"):
        op.attention(q, k, v)
    assert kernels.calls == []


def test_a_gpu_that_is_not_sm90_is_named_with_its_capability(monkeypatch):
    monkeypatch.setattr(checks, "_device_facts", lambda index: (8, 0, 108, "NVIDIA A100"))
    with FakeTensorMode():
        with pytest.raises(RuntimeError, match=r"^q is on cuda:0 \(NVIDIA A100, compute "
                                               r"capability 8\.0\)"):
            op.check_inputs(*qkv(device="cuda"))


def test_more_workers_than_sms_is_refused(fake_cuda):
    with pytest.raises(ValueError, match=r"^num_workers=133 exceeds this GPU's 132 SMs"):
        op.check_inputs(*qkv(device="cuda"), num_workers=133)
    # 2 x 8 heads of 16 KV tiles: 256 units, so no fewer workers than asked for
    assert op.check_inputs(*qkv(device="cuda", seqlen_k=2048), schedule="fa3",
                           num_workers=132).num_workers == 132


@pytest.mark.parametrize("schedule, causal, least", [("shift", False, 16),
                                                    ("symmetric_shift", True, 8)])
def test_a_shift_schedule_below_one_sequences_units_is_refused(fake_cuda, schedule, causal,
                                                               least):
    """A sequence's units all run at once: 16 KV tiles (shift) or 8 pairs (symmetric_shift)."""
    shape = dict(device="cuda", seqlen_q=2048, seqlen_k=2048)
    with pytest.raises(ValueError, match=rf"^num_workers: schedule '{schedule}' needs at least "
                                         rf"{least} workers .*num_workers={least - 1}"):
        op.check_inputs(*qkv(**shape), causal=causal, schedule=schedule, num_workers=least - 1)
    opts = op.check_inputs(*qkv(**shape), causal=causal, schedule=schedule, num_workers=least)
    assert opts.num_workers == least


@pytest.mark.parametrize("schedule, causal", [("shift", True), ("symmetric_shift", False)])
def test_schedule_that_cannot_serve_is_a_value_error_naming_schedule(fake_cuda, schedule, causal):
    with pytest.raises(ValueError, match=rf"^schedule='{schedule}' cannot serve this problem"):
        op.check_inputs(*qkv(device="cuda"), causal=causal, schedule=schedule, num_workers=7)


def test_errors_raised_through_attention_launch_nothing(on_cpu, kernels):
    q, k, v = cpu_leaves()
    for kwargs in (dict(num_workers=133), dict(schedule="symmetric_shift"),
                   dict(softmax_scale=-1.0)):
        with pytest.raises(ValueError):
            op.attention(q, k, v, **kwargs)
    assert kernels.calls == []


# -- the resolved Options ------------------------------------------------------------------------

def test_check_inputs_resolves_the_defaults(fake_cuda, restore_determinism):
    torch.use_deterministic_algorithms(True)  # the default deterministic=None follows it
    opts = op.check_inputs(*qkv(device="cuda"), causal=True)
    # batch 2 x 8 query heads x one KV tile (70 keys): 16 units, one a worker
    assert opts == op.Options(causal=True, softmax_scale=1 / 8, deterministic=True,
                              schedule="symmetric_shift", num_workers=16)
    assert op.check_inputs(*qkv(device="cuda"), softmax_scale=2).softmax_scale == 2.0
    full = op.check_inputs(*qkv(device="cuda", head_dim=128, seqlen_k=2048), schedule="fa3")
    assert full == op.Options(causal=False, softmax_scale=1 / math.sqrt(128), deterministic=True,
                              schedule="fa3", num_workers=132)


def test_the_sm_count_comes_from_the_device(monkeypatch):
    monkeypatch.setattr(checks, "_device_facts", lambda index: (9, 0, 114, "NVIDIA H100 PCIe"))
    with FakeTensorMode():
        assert op.check_inputs(*qkv(device="cuda", seqlen_k=2048),
                               schedule="spt").num_workers == 114
        with pytest.raises(ValueError, match=r"^num_workers=115 exceeds this GPU's 114 SMs"):
            op.check_inputs(*qkv(device="cuda"), num_workers=115)


@pytest.mark.parametrize("flag", [True, False])
def test_deterministic_none_follows_torch(fake_cuda, restore_determinism, flag):
    torch.use_deterministic_algorithms(flag)
    assert op.check_inputs(*qkv(device="cuda"), deterministic=None).deterministic is flag
    assert op.check_inputs(*qkv(device="cuda")).deterministic is flag  # None is the default
    assert op.check_inputs(*qkv(device="cuda"), deterministic=True).deterministic is True


def test_deterministic_false_under_the_flag_raises_before_any_kernel(on_cpu, kernels,
                                                                     restore_determinism):
    torch.use_deterministic_algorithms(True)
    q, k, v = cpu_leaves()
    with pytest.raises(RuntimeError, match=r"^deterministic=False asks for dashgen's "
                                           r"non-deterministic backward .* "
                                           r"torch.use_deterministic_algorithms\(True\)"):
        op.attention(q, k, v, deterministic=False)
    assert kernels.calls == []
    torch.use_deterministic_algorithms(False)
    assert op.check_inputs(q, k, v, deterministic=False).deterministic is False


def test_deterministic_false_under_warn_only_warns_and_runs_nondeterministic(
        on_cpu, kernels, restore_determinism):
    torch.use_deterministic_algorithms(True, warn_only=True)
    q, k, v = cpu_leaves()
    with pytest.warns(UserWarning, match=r"^deterministic=False asks for"):
        op.attention(q, k, v, deterministic=False).sum().backward()
    prepared = [options for name, options in kernels.calls if name == "prepare"]
    assert prepared[-1]["deterministic"] is False


def test_deterministic_none_follows_the_flag_on_every_call(on_cpu, restore_determinism):
    q, k, v = cpu_leaves()
    torch.use_deterministic_algorithms(True)
    assert op.check_inputs(q, k, v, deterministic=None).deterministic is True
    torch.use_deterministic_algorithms(False)
    assert op.check_inputs(q, k, v, deterministic=None).deterministic is False  # not the memo's


def test_deterministic_none_reaches_the_backward(on_cpu, kernels, restore_determinism):
    for flag in (True, False):
        torch.use_deterministic_algorithms(flag)
        q, k, v = cpu_leaves()
        op.attention(q, k, v, deterministic=None).sum().backward()
        prepared = [options for name, options in kernels.calls if name == "prepare"]
        assert prepared[-1]["deterministic"] is flag


def test_a_validated_signature_still_refuses_other_argument_types(on_cpu):
    q, k, v = cpu_leaves()
    assert op.check_inputs(q, k, v, causal=True).causal is True
    assert len(op._VALIDATED) == 1
    with pytest.raises(TypeError, match=r"^causal must be a bool, got 1"):
        op.check_inputs(q, k, v, causal=1)  # equal to True and hashed alike, still refused
    with pytest.raises(TypeError, match=r"^softmax_scale must be a float or None, got True"):
        op.check_inputs(q, k, v, causal=True, softmax_scale=True)
    with pytest.raises(ValueError, match=r"^k has head_dim 32 but q has head_dim 64"):
        op.check_inputs(q, k[..., :32], v, causal=True)


# -- what reaches the kernels --------------------------------------------------------------------

def test_options_reach_forward_and_the_prepared_backward(on_cpu, kernels):
    q, k, v = cpu_leaves()
    out = op.attention(q, k, v, causal=True, softmax_scale=0.2, deterministic=False,
                       schedule="symmetric_shift", num_workers=7)
    do = torch.randn_like(out)
    torch.autograd.grad(out, (q, k, v), do)
    assert kernels.calls == [
        ("forward", dict(causal=True, softmax_scale=0.2)),
        ("prepare", dict(causal=True, softmax_scale=0.2, deterministic=False,
                         schedule="symmetric_shift", num_workers=7)),
        ("call", dict(do=do.data_ptr())),
    ]
    assert kernels.prepared[0][:3] == tuple(t.data_ptr() for t in (q, k, v))


def test_the_eager_node_hands_the_backward_the_selection_of_its_options(on_cpu, kernels,
                                                                       monkeypatch):
    """One plan per signature: the checks resolve the schedule once, the kernels are chosen
    once, and the prepared backward gets the launch of that choice: what select() gives for the
    options it was prepared with. A repeated call chooses and prepares nothing again."""
    from dashgen.runtime import select
    made = []
    real = select.Plan.__init__
    monkeypatch.setattr(select.Plan, "__init__",
                        lambda self, *a, **kw: made.append(1) or real(self, *a, **kw))
    q, k, v = cpu_leaves()
    for _ in range(2):
        op.attention(q, k, v, causal=True).sum().backward()
    assert len(made) == 1 and len(kernels.launches) == 2
    assert kernels.launches == kernels.backward_launches * 2  # made once, handed twice
    assert kernels.launches[0].device == q.device
    options = [options for name, options in kernels.calls if name == "prepare"][0]
    assert kernels.launches[0].selection == select.select(
        select.problem_for(2, 8, 2, 100, 70, 64, True), "bf16", sm_count=132,
        deterministic=options["deterministic"], schedule=options["schedule"],
        num_workers=options["num_workers"])


def test_the_resolved_defaults_reach_the_kernels(on_cpu, kernels, restore_determinism):
    torch.use_deterministic_algorithms(True)
    q, k, v = cpu_leaves(head_dim=128)
    op.attention(q, k, v).sum().backward()
    assert kernels.calls[0] == ("forward", dict(causal=False, softmax_scale=1 / math.sqrt(128)))
    # batch 2 x 8 heads x one KV tile: auto's shift on the 16 units' worth of workers
    assert kernels.calls[1] == ("prepare", dict(causal=False, softmax_scale=1 / math.sqrt(128),
                                                deterministic=True, schedule="shift",
                                                num_workers=16))


def test_return_lse_gives_the_forwards_lse_not_differentiable(on_cpu, kernels):
    q, k, v = cpu_leaves()
    o, lse = op.attention(q, k, v, causal=True, return_lse=True)
    with torch.no_grad():
        plain_o, plain_lse = op.attention(q, k, v, causal=True, return_lse=True)
    ref_o, ref_lse = kernels.forward(q.detach(), k.detach(), v.detach(), causal=True,
                                     softmax_scale=1 / 8)
    assert torch.equal(o.detach(), ref_o) and torch.equal(lse, ref_lse)
    assert torch.equal(plain_o, ref_o) and torch.equal(plain_lse, ref_lse)
    assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32 and not lse.requires_grad
    o.sum().backward()  # the lse output takes no part in the backward
    assert q.grad is not None
    with pytest.raises(TypeError, match=r"^return_lse must be a bool, got 1"):
        op.attention(q, k, v, return_lse=1)


def test_gradients_reach_the_right_inputs(on_cpu):
    q, k, v = cpu_leaves(heads_q=4, heads_kv=1)
    do = torch.randn_like(q)
    op.attention(q, k, v, causal=True).backward(do)
    dq, dk, dv = fake_gradients(do, q, k, v)
    assert torch.equal(q.grad, dq) and torch.equal(k.grad, dk) and torch.equal(v.grad, dv)


def test_inference_skips_autograd_and_gives_the_same_output(on_cpu, kernels):
    q, k, v = cpu_leaves()
    with_grad = op.attention(q, k, v, causal=True)
    with torch.no_grad():
        plain = op.attention(q, k, v, causal=True)
    frozen = op.attention(*(t.detach() for t in (q, k, v)), causal=True)
    assert with_grad.grad_fn is not None
    assert plain.grad_fn is None and frozen.grad_fn is None and not plain.requires_grad
    assert torch.equal(plain, with_grad.detach()) and torch.equal(frozen, plain)
    # Only the autograd call prepared a backward.
    assert [name for name, _ in kernels.calls] == ["forward", "prepare", "forward", "forward"]


def test_strided_views_and_expanded_gradients_reach_the_kernels_contiguous(on_cpu, kernels):
    torch.manual_seed(0)
    # (batch, heads, seqlen, head_dim) storage seen as (batch, seqlen, heads, head_dim)
    q, k, v = (torch.randn(2, h, s, 64, dtype=BF16).transpose(1, 2).requires_grad_()
               for h, s in ((8, 100), (2, 70), (2, 70)))
    assert not q.is_contiguous()
    op.attention(q, k, v).sum().backward()  # o.sum() sends an expanded, stride-0 gradient
    assert [name for name, _ in kernels.calls] == ["forward", "prepare", "call"]  # all checked
    assert torch.equal(q.grad, torch.full_like(q, 2.0)) and torch.equal(v.grad,
                                                                        torch.full_like(v, 5.0))


def test_views_at_unaligned_offsets_reach_the_kernels_aligned(on_cpu, kernels):
    """A contiguous view starting 2 bytes into its buffer (TMA and the kernels' 16-byte loads
    need 16-byte boundaries) is copied before the kernels see it."""
    torch.manual_seed(0)
    shape = (1, 40, 2, 64)
    views = [torch.randn(math.prod(shape) + 1, dtype=BF16)[1:].view(shape) for _ in range(4)]
    assert all(t.is_contiguous() and t.data_ptr() % 16 for t in views)
    q, k, v = (t.detach().requires_grad_() for t in views[:3])
    o = op.attention(q, k, v, causal=True)
    o.backward(views[3])
    ref = [t.detach().clone().requires_grad_() for t in views[:3]]
    ref_o = op.attention(*ref, causal=True)
    ref_o.backward(views[3].clone())
    assert torch.equal(o, ref_o)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip((q, k, v), ref))
    assert not any(p % 16 for p in kernels.prepared[0])


def test_saved_tensor_hooks_get_a_backward_of_their_own(on_cpu, kernels):
    """Hooks that hand the backward copies (offloading): the node prepares again for the
    copies, and the gradients are those of the plain call."""
    q, k, v = cpu_leaves()
    do = torch.randn_like(q)
    plain = torch.autograd.grad(op.attention(q, k, v, causal=True), (q, k, v), do)
    assert len(kernels.prepared) == 1
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.detach().clone(), lambda t: t):
        out = op.attention(q, k, v, causal=True)
    hooked = torch.autograd.grad(out, (q, k, v), do)
    assert len(kernels.prepared) == 3 and kernels.prepared[1] != kernels.prepared[2]
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))


# -- the custom ops and torch.compile ------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fake_forward_and_backward_shapes(dtype, kernels):
    q, k, v = qkv(dtype=dtype)
    o, lse = torch.ops.dashgen.attention_fwd(q, k, v, True, 0.125, True, "spt", 132)
    assert (o.shape, o.dtype, o.device.type) == (q.shape, dtype, "meta")
    assert (lse.shape, lse.dtype) == ((2, 8, 100), torch.float32)
    grads = torch.ops.dashgen.attention_bwd(torch.empty_like(o), q, k, v, o, lse, True, 0.125,
                                            True, "spt", 132)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, dtype) for t in (q, k, v)]
    assert kernels.calls == []  # meta tensors take the fake kernels


def test_fake_cuda_tensors_run_through_attention(fake_cuda, kernels):
    # No backward here: the autograd engine of a CPU-only torch aborts on (fake) CUDA tensors.
    q, k, v = qkv(device="cuda")
    o = op.attention(q, k, v, causal=True)
    assert (o.shape, o.dtype, o.device.type) == (q.shape, BF16, "cuda")
    assert kernels.calls == []


def test_the_custom_ops_call_the_runtime_with_their_options(on_cpu, kernels):
    q, k, v = (t.detach() for t in cpu_leaves())
    o, lse = torch.ops.dashgen.attention_fwd(q, k, v, True, 0.125, False, "spt", 5)
    do = torch.randn_like(o)
    dq, dk, dv = torch.ops.dashgen.attention_bwd(do, q, k, v, o, lse, True, 0.125, False,
                                                 "spt", 5)
    assert kernels.calls == [
        ("forward", dict(causal=True, softmax_scale=0.125)),
        ("backward", dict(causal=True, softmax_scale=0.125, deterministic=False, schedule="spt",
                          num_workers=5)),
    ]
    assert all(torch.equal(a, b) for a, b in zip((dq, dk, dv), fake_gradients(do, q, k, v)))


def test_lse_is_not_differentiable(on_cpu):
    q, k, v = cpu_leaves()
    o, lse = torch.ops.dashgen.attention_fwd(q, k, v, False, 0.125, True, "fa3", 132)
    assert o.requires_grad and not lse.requires_grad


def test_opcheck_both_ops(on_cpu):
    q, k, v = cpu_leaves()
    args = (q, k, v, True, 0.125, True, "spt", 132)
    torch.library.opcheck(torch.ops.dashgen.attention_fwd.default, args)
    o, lse = torch.ops.dashgen.attention_fwd(*(a.detach() if torch.is_tensor(a) else a
                                               for a in args))
    torch.library.opcheck(torch.ops.dashgen.attention_bwd.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse,
                           True, 0.125, True, "spt", 132))


def test_eager_and_traced_paths_agree_and_a_second_derivative_raises(on_cpu, kernels):
    q, k, v = cpu_leaves()
    do = torch.randn_like(q)
    eager = op.attention(q, k, v, causal=True)
    assert type(eager.grad_fn).__name__ == "_EagerAttentionBackward"
    o, _ = torch.ops.dashgen.attention_fwd(q, k, v, True, 1 / 8, True, "symmetric_shift", 16)
    assert torch.equal(eager, o)
    grads = torch.autograd.grad(eager, (q, k, v), do, create_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, torch.autograd.grad(o, (q, k, v), do)))
    backward = [options for name, options in kernels.calls if name == "backward"]
    assert backward == [dict(causal=True, softmax_scale=1 / 8, deterministic=True,
                             schedule="symmetric_shift", num_workers=16)]
    # A second derivative raises; it never comes back as silent zeros.
    with pytest.raises(RuntimeError, match="does not require grad"):
        torch.autograd.grad(grads[0].sum(), q)


def test_torch_compile_traces_the_custom_ops_and_matches_eager_bitwise(on_cpu, kernels,
                                                                       restore_determinism):
    torch._dynamo.reset()
    torch.use_deterministic_algorithms(True)  # the default deterministic=None follows it
    q, k, v = cpu_leaves()
    do = torch.randn_like(q)
    eager = op.attention(q, k, v, causal=True)
    eager_grads = torch.autograd.grad(eager, (q, k, v), do)
    kernels.calls.clear()
    compiled = torch.compile(op.attention, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert torch.equal(out, eager)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))
    # The compiled graph runs the custom ops (no prepared eager call), with the eager options.
    assert [name for name, _ in kernels.calls] == ["forward", "backward"]
    assert kernels.calls[1][1] == dict(causal=True, softmax_scale=1 / 8, deterministic=True,
                                       schedule="symmetric_shift", num_workers=16)
    torch._dynamo.reset()


def test_torch_compile_traces_mla_with_vs_width(on_cpu, kernels):
    """q/k 192 with v 128 through the custom ops: the fake kernels' o is v's width, so the
    traced graph's shapes are the eager call's, and so are its values and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    q, k = (torch.randn(1, 64, 4, 192, dtype=BF16, requires_grad=True) for _ in range(2))
    v = torch.randn(1, 64, 4, 128, dtype=BF16, requires_grad=True)
    do = torch.randn(1, 64, 4, 128, dtype=BF16)
    eager = op.attention(q, k, v, causal=True, deterministic=True)
    eager_grads = torch.autograd.grad(eager, (q, k, v), do)
    compiled = torch.compile(op.attention, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, causal=True, deterministic=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    assert out.shape == (1, 64, 4, 128) and torch.equal(out, eager)
    assert all(torch.equal(a, b) for a, b in zip(grads, eager_grads))
    torch._dynamo.reset()


def test_torch_compile_still_raises_value_errors(on_cpu, kernels):
    torch._dynamo.reset()
    q, k, v = cpu_leaves()
    compiled = torch.compile(op.attention, backend="aot_eager")
    with pytest.raises(ValueError, match=r"^num_workers=500 exceeds"):
        compiled(q, k, v, num_workers=500)
    assert kernels.calls == []
    torch._dynamo.reset()


# -- the contract with dashgen.runtime -----------------------------------------------------------

def test_importing_the_op_loads_neither_the_runtime_calls_nor_the_launcher():
    code = ("import sys, dashgen.runtime.op; "
            "loaded = [m for m in ('dashgen.runtime.backward', 'dashgen.runtime.forward', "
            "'dashgen.runtime.device', 'dashgen.runtime.launch') if m in sys.modules]; "
            "assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_first_call_imports_no_compiler():
    """torch._dynamo takes seconds to import; an eager call (here one refused for its device,
    after every module the call path loads) must not pay it."""
    code = ("import sys, torch, dashgen, dashgen.runtime.op_varlen, dashgen.runtime.backward, "
            "dashgen.runtime.device, dashgen.runtime.launch, "
            "dashgen.runtime.forward\n"
            "q = torch.zeros(1, 8, 2, 64, dtype=torch.bfloat16)\n"
            "try:\n    dashgen.attention(q, q, q)\nexcept ValueError:\n    pass\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_constant_for_compile_marks_what_torch_compiler_marks():
    def theirs():
        pass

    def ours():
        pass
    torch.compiler.assume_constant_result(theirs)
    op.constant_for_compile(ours)
    assert vars(theirs) and vars(ours) == vars(theirs)


def test_dashgen_exports_attention_lazily():
    code = ("import sys, dashgen; assert 'torch' not in sys.modules, 'dashgen loaded torch'; "
            "import dashgen.runtime.op; assert dashgen.attention is dashgen.runtime.op.attention")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_runtime_takes_what_the_op_passes(monkeypatch):
    """The real _kernels() hands out the runtime's functions, and their signatures take what
    the op calls them with."""
    try:
        from dashgen.runtime import backward as runtime_backward
        from dashgen.runtime import forward as runtime_forward
    except ImportError as exc:  # the driver bindings are missing on this machine
        pytest.skip(f"dashgen.runtime does not import here: {exc}")
    monkeypatch.undo()  # the real _kernels()
    monkeypatch.setattr(op, "_KERNELS", None)
    real = op._kernels()
    assert real.forward is runtime_forward.forward
    assert real.backward is runtime_backward.backward
    assert real.BackwardCall is runtime_backward.BackwardCall
    assert real.forward_call is runtime_forward.forward_call
    assert real.backward_launch is runtime_backward.backward_launch
    assert {"causal", "softmax_scale"} <= set(inspect.signature(real.forward).parameters)
    assert list(inspect.signature(real.forward_call.fn).parameters) == [
        "q_shape", "k_shape", "dtype", "causal", "softmax_scale", "device", "overrides",
        "softcap", "window", "head_dim_v"]
    assert list(inspect.signature(real.backward_launch.fn).parameters) == ["sel", "device"]
    options = set(op._backward_options(op.Options(True, 0.1, True, "fa3", 3)))
    assert options <= set(inspect.signature(real.backward).parameters)
    prepared = inspect.signature(real.BackwardCall)
    assert list(prepared.parameters)[:5] == ["q", "k", "v", "o", "lse"]
    assert options | {"launch"} <= set(prepared.parameters)
    assert list(inspect.signature(real.BackwardCall.serves).parameters) == [
        "self", "q", "k", "v", "o", "lse"]
    assert list(inspect.signature(real.BackwardCall.__call__).parameters) == ["self", "do"]


@pytest.mark.parametrize("softcap, error, pattern", [
    (-2.0, ValueError, r"^softcap must be 0 \(no capping\) or a positive, finite cap, got -2.0$"),
    (float("nan"), ValueError, r"^softcap must be 0 \(no capping\) or a positive, finite cap"),
    (None, TypeError, r"^softcap must be a float, got None$"),
    (False, TypeError, r"^softcap must be a float, got False$"),
])
def test_a_bad_softcap_is_named(softcap, error, pattern):
    with pytest.raises(error, match=pattern):
        op.check_inputs(*qkv(), softcap=softcap)


def test_softcap_rides_with_the_options(on_cpu, kernels, monkeypatch):
    """A cap is part of the resolved options (the custom ops' last argument) and of the
    signature: the same tensors with and without it are two entries."""
    q, k, v = cpu_leaves()
    assert op.check_inputs(q, k, v, softcap=50).softcap == 50.0
    assert op.check_inputs(q, k, v).softcap == 0.0
    op.attention(q, k, v, softcap=5.0).sum().backward()
    op.attention(q, k, v).sum().backward()
    forwards = [options for name, options in kernels.calls if name == "forward"]
    assert [options.get("softcap") for options in forwards] == [5.0, None]



@pytest.mark.parametrize("window_size, error, pattern", [
    (3, TypeError, r"^window_size must be a pair of ints \(left, right\), got 3$"),
    ((1, 2, 3), TypeError, r"^window_size must be a pair of ints \(left, right\), got \(1, 2, 3\)$"),
    ((1.0, 0), TypeError, r"^window_size must be a pair of ints \(left, right\), got \(1.0, 0\)$"),
    ((True, 0), TypeError, r"^window_size must be a pair of ints"),
])
def test_a_bad_window_is_named(window_size, error, pattern):
    with pytest.raises(error, match=pattern):
        op.check_inputs(*qkv(), window_size=window_size)


@pytest.mark.parametrize("window_size", [
    torch.tensor([3, 0]), (torch.tensor(3), 0), [3, torch.tensor(0, dtype=torch.int32)],
])
def test_a_window_of_integer_tensors_is_the_window_of_its_ints(on_cpu, window_size):
    """FlashAttention indexes window_size and takes any integers: FA3's own varlen tests pass
    torch.randint's 2-element tensor."""
    assert op.check_inputs(*cpu_leaves(), window_size=window_size).window == (3, 0)


@pytest.mark.parametrize("window_size", [torch.tensor([3.0, 0.0]), torch.tensor([True, False])])
def test_a_window_of_float_or_bool_tensors_is_named(window_size):
    with pytest.raises(TypeError, match=r"^window_size must be a pair of ints"):
        op.check_inputs(*qkv(), window_size=window_size)


def test_windows_of_a_full_or_causal_mask_run_those_kernels(on_cpu, kernels):
    """(-1, -1) is the full mask, (-1, 0) and causal=True with any right bound the causal one
    (FlashAttention reads a negative bound as open): no window reaches the kernels."""
    q, k, v = cpu_leaves()
    for window, causal, expect in (((-1, -1), False, False), ((-1, 0), False, True),
                                   ((-5, 0), False, True), ((-1, 7), True, True)):
        options = op.check_inputs(q, k, v, causal=causal, window_size=window)
        assert (options.causal, options.window) == (expect, (-1, -1)), window


def test_a_window_rides_with_the_options(on_cpu, kernels):
    """A window is part of the resolved options (the custom ops' last two arguments), causal
    making its right bound 0, and reaches the forward and the prepared backward."""
    q, k, v = cpu_leaves()
    options = op.check_inputs(q, k, v, causal=True, window_size=(3, 9), deterministic=True)
    assert (options.causal, options.window, options.schedule) == (False, (3, 0), "spt_listed")
    op.attention(q, k, v, causal=True, window_size=(3, 9)).sum().backward()
    recorded = [(name, options.get("window")) for name, options in kernels.calls
                if name != "call"]  # the prepared call's __call__ takes dO alone
    assert recorded == [("forward", (3, 0)), ("prepare", (3, 0))]
