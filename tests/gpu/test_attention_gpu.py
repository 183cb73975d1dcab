"""dashgen.attention on an sm_90 GPU: accuracy against float64 (held to 2x PyTorch's own error in
the input dtype), bitwise determinism under a busy GPU, kernel trace = schedule IR, compile.

Run: PYTHONPATH=. python3 -m pytest tests/gpu -q
"""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from dashgen import Problem, build_schedule, list_schedules  # noqa: E402
from dashgen.codegen.variants import TRACE_COLUMNS  # noqa: E402
from dashgen.runtime.backward import backward  # noqa: E402
from dashgen.runtime.forward import forward, forward_variant  # noqa: E402
from dashgen.runtime.op import attention  # noqa: E402
from dashgen.runtime.select import Overrides, problem_for, selection  # noqa: E402
from dashgen.codegen.variants import (DQ_LAST_HEAD_DIMS, DQ_WRITERS_KERNEL_HEAD_DIMS,  # noqa: E402
                                     HEAD_DIMS, kernel_head_dim)
from dashgen.schedule.builders import BUILDERS, Tiling, unsupported_reason  # noqa: E402
from dashgen.runtime.select import balanced_workers  # noqa: E402

pytestmark = pytest.mark.gpu

SMALL_ODD_WORKERS = 7  # fewer workers than tiles and co-prime with everything: many waves
GQA = [(4, 4), (8, 2), (16, 1)]  # ratios 1, 4 and 16 (MQA)
SEQLENS = [(1, 1), (100, 100), (257, 257), (1000, 1000), (100, 257), (257, 100)]


# -- references --------------------------------------------------------------------------------

def math_attention(q, k, v, causal, scale):
    """Attention in the dtype of q/k/v, (batch, seqlen, heads, head_dim) layout, bottom-right
    causal: row i sees key j iff j <= i + seqlen_k - seqlen_q; a row that sees no key gives 0."""
    group = q.shape[2] // k.shape[2]
    qt = q.transpose(1, 2)
    kt = k.repeat_interleave(group, 2).transpose(1, 2)
    vt = v.repeat_interleave(group, 2).transpose(1, 2)
    scores = (qt @ kt.transpose(-1, -2)) * scale
    if causal:
        seqlen_q, seqlen_k = q.shape[1], k.shape[1]
        i = torch.arange(seqlen_q, device=q.device)[:, None]
        j = torch.arange(seqlen_k, device=q.device)[None, :]
        keep = j <= i + seqlen_k - seqlen_q
        scores = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(scores, -1).masked_fill(~keep.any(-1, keepdim=True), 0.0)
    else:
        probs = torch.softmax(scores, -1)
    return (probs @ vt).transpose(1, 2)


def out_and_grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do.to(o.dtype)))


def rel_err(x, ref) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-6)).item()


def rms(x) -> float:
    return (x.double().norm() / x.numel() ** 0.5).item()


# A gradient that is zero in exact math (every row sees one key: seqlen_k = 1) has no relative
# error to speak of; PyTorch's math even gets it exactly, while any fp32 kernel leaves a residue
# (dP - D cancels to ~1e-7). Below this RMS a reference counts as zero ...
ZERO_RMS = 1e-6
# ... and the kernel's result must stay at float32 noise, far below any real gradient.
ZERO_TOLERANCE_RMS = 1e-4


class Case:
    """Fresh randn inputs for one problem plus the float64 and input-dtype references."""

    def __init__(self, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal,
                 dtype=torch.bfloat16, softmax_scale=None, head_dim_v=None):
        self.causal = causal
        self.head_dim = head_dim
        self.scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
        self.softmax_scale = softmax_scale
        width_v = head_dim if head_dim_v is None else head_dim_v  # V's, O's and dO's
        make = lambda s, h, d=head_dim: torch.randn(batch, s, h, d, device="cuda",  # noqa: E731
                                                    dtype=dtype)
        self.q, self.k, self.v = make(seqlen_q, heads_q), make(seqlen_k, heads_kv), \
            make(seqlen_k, heads_kv, width_v)
        self.do = make(seqlen_q, heads_q, width_v)
        # The problem in the tiles of the backward that runs (schedules are built in them).
        self.problem = problem_for(batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                                   causal)
        ref = lambda q, k, v: math_attention(q, k, v, causal, self.scale)
        self.ref = out_and_grads(ref, *(t.double() for t in (self.q, self.k, self.v)),
                                 self.do.double())
        self.torch_err = [rel_err(x, r) for x, r in
                          zip(out_and_grads(ref, self.q, self.k, self.v, self.do), self.ref)]

    def failures(self, **options) -> list[str]:
        """errors() of attention() called with these options."""
        ours = out_and_grads(lambda q, k, v: attention(
            q, k, v, causal=self.causal, softmax_scale=self.softmax_scale, **options),
            self.q, self.k, self.v, self.do)
        return self.errors(ours, options)

    def run(self, overrides: Overrides, schedule: str, num_workers: int,
            deterministic: bool = True) -> tuple:
        """(o, dq, dk, dv) from the runtime's forward and backward under `overrides`."""
        o, lse = forward(self.q, self.k, self.v, causal=self.causal, softmax_scale=self.scale,
                         overrides=overrides)
        grads = backward(self.do, self.q, self.k, self.v, o, lse, causal=self.causal,
                         softmax_scale=self.scale, deterministic=deterministic,
                         schedule=schedule, num_workers=num_workers, overrides=overrides)
        return (o, *grads)

    def errors(self, ours, options) -> list[str]:
        """Which of o/dq/dk/dv in `ours` err more than 2x PyTorch's own (plus a 1e-6 floor)."""
        bad = []
        for name, x, r, limit in zip(("o", "dq", "dk", "dv"), ours, self.ref, self.torch_err):
            if rms(r) < ZERO_RMS:
                if not rms(x) <= ZERO_TOLERANCE_RMS:
                    bad.append(f"{options}: {name} should be 0, has RMS {rms(x):.3e}")
                continue
            err = rel_err(x, r)
            if not (err <= 2 * limit + 1e-6):  # also catches NaN
                bad.append(f"{options}: {name} error {err:.3e} > 2 x torch's {limit:.3e}")
        return bad


def serving_plans(problem: Problem, sm_count: int) -> list[dict]:
    """attention() options for every schedule that serves the problem, on the full worker count
    and, where it is live there, a small odd one."""
    plans = []
    for name in list_schedules():
        if unsupported_reason(name, problem) is not None:
            continue
        plans.append(dict(schedule=name, deterministic=True))
        if BUILDERS[name].min_workers(problem) <= SMALL_ODD_WORKERS:
            plans.append(dict(schedule=name, num_workers=SMALL_ODD_WORKERS, deterministic=True))
    return plans


# -- (a) accuracy ------------------------------------------------------------------------------

@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLENS, ids=lambda s: str(s))
@pytest.mark.parametrize("heads_q, heads_kv", GQA, ids=lambda h: str(h))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_every_schedule_matches_float64(head_dim, causal, heads_q, heads_kv, seqlen_q, seqlen_k,
                                        sm_count, seed):
    case = Case(2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    plans = serving_plans(case.problem, sm_count)
    assert len(plans) >= 4
    bad = [msg for plan in plans for msg in case.failures(**plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_fp16_matches_float64(head_dim, causal, sm_count, seed):
    case = Case(2, 8, 2, 1000, 257, head_dim, causal, dtype=torch.float16)
    bad = [msg for plan in serving_plans(case.problem, sm_count) for msg in case.failures(**plan)]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(257, 257), (1000, 1000), (100, 257)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_non_deterministic_mode_is_still_accurate(causal, seqlen_q, seqlen_k, sm_count, seed):
    """deterministic=False through attention() (where a plan converts dQ in the main kernel,
    which on all the workers these short sequences do, that is the ordered kernel:
    docs/design.md `unordered-unfused`) and the unordered kernel itself under every plan, with
    the convert kernel after it."""
    case = Case(2, 8, 2, seqlen_q, seqlen_k, 128, causal)
    plans = [{**plan, "deterministic": False} for plan in serving_plans(case.problem, sm_count)]
    bad = [msg for plan in plans for msg in case.failures(**plan)]
    unordered = Overrides(fused_convert=False)
    for plan in plans:
        ours = case.run(unordered, plan["schedule"], plan.get("num_workers"), deterministic=False)
        bad += case.errors(ours, {**plan, "overrides": unordered})
    assert not bad, "\n".join(bad)


def test_custom_softmax_scale(seed):
    case = Case(1, 4, 4, 257, 257, 64, True, softmax_scale=0.3)
    bad = case.failures(deterministic=True)
    assert not bad, "\n".join(bad)


def test_strided_inputs_give_the_same_bits_as_contiguous_ones(seed):
    # (batch, heads, seqlen, head_dim) storage seen as (batch, seqlen, heads, head_dim)
    q, k, v = (torch.randn(2, h, 300, 128, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
               for h in (8, 2, 2))
    do = torch.randn_like(q)
    fn = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)
    strided = out_and_grads(fn, q, k, v, do)
    contiguous = out_and_grads(fn, q.contiguous(), k.contiguous(), v.contiguous(), do)
    assert all(torch.equal(a, b) for a, b in zip(strided, contiguous))


def test_views_at_unaligned_offsets_give_the_same_bits_as_aligned_copies(seed):
    """TMA and the 16-byte loads need 16-byte boundaries: a contiguous view 2 bytes into its
    buffer is copied first, never read misaligned."""
    shape = (2, 300, 4, 64)
    numel = 2 * 300 * 4 * 64
    q, k, v, do = (torch.randn(numel + 1, device="cuda", dtype=torch.bfloat16)[1:].view(shape)
                   for _ in range(4))
    assert all(t.data_ptr() % 16 for t in (q, k, v, do))

    def run(q, k, v, do):  # out_and_grads would clone q, k and v, aligning them
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        assert [t.data_ptr() for t in leaves] == [t.data_ptr() for t in (q, k, v)]
        o = attention(*leaves, causal=True, deterministic=True)
        return (o.detach(), *torch.autograd.grad(o, leaves, do))

    views = run(q, k, v, do)
    copies = run(q.clone(), k.clone(), v.clone(), do.clone())
    assert all(torch.equal(a, b) for a, b in zip(views, copies))


def test_a_fresh_thread_gets_the_same_bits(seed):
    """Calls from a thread that never touched CUDA (like autograd's per-device backward thread,
    once the kernels are loaded and their launches cached) run in the right context."""
    q, k, v, do = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    fn = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)
    here = out_and_grads(fn, q, k, v, do)
    there = []
    worker = threading.Thread(target=lambda: there.append(out_and_grads(fn, q, k, v, do)))
    worker.start()
    worker.join()
    assert there, "the call on the fresh thread raised"
    assert all(torch.equal(a, b) for a, b in zip(here, there[0]))


@pytest.mark.parametrize("wrap", ["save_on_cpu", "checkpoint"])
def test_offloaded_or_recomputed_saved_tensors_give_the_same_bits(wrap, seed):
    """Saved-tensor hooks hand the backward other tensors than the forward's (copies brought
    back from the CPU, or a recomputation): the backward reads those, with the plain call's
    bits. The forward prepared its backward for its own tensors, which are gone by then."""
    q, k, v, do = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    fn = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)
    plain = out_and_grads(fn, q, k, v, do)
    if wrap == "save_on_cpu":
        def wrapped(q, k, v):
            with torch.autograd.graph.save_on_cpu():
                return fn(q, k, v)
    else:
        from torch.utils.checkpoint import checkpoint
        wrapped = lambda q, k, v: checkpoint(fn, q, k, v, use_reentrant=False)
    hooked = out_and_grads(wrapped, q, k, v, do)
    assert all(torch.equal(a, b) for a, b in zip(plain, hooked))


@pytest.mark.parametrize("shape", [(2, 300, 100, 4, 4, 64), (1, 257, 257, 8, 2, 128),
                                   (1, 300, 200, 6, 3, 96)],
                         ids=["rows-without-keys", "gqa", "gqa-d96"])
def test_under_deterministic_algorithms_every_output_is_written(shape, seed):
    """torch.use_deterministic_algorithms(True) makes torch.empty fill with NaN; the runtime
    allocates its buffers without that fill. Memory the caching allocator hands back full of
    NaN must not reach o, dq, dk or dv: every element is written by the kernels. The bits are
    those of the flag off, and the user's fill setting is back after the calls."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = shape
    q, do = (torch.randn(batch, seqlen_q, heads_q, head_dim, device="cuda",
                         dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    fn = lambda q, k, v: attention(q, k, v, causal=True, deterministic=None)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        poison = torch.full((64 << 20,), float("nan"), device="cuda")  # 256 MB back to the cache
        del poison
        flagged = out_and_grads(fn, q, k, v, do)
        assert torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(before)
    plain = out_and_grads(lambda q, k, v: attention(q, k, v, causal=True, deterministic=True), q, k, v, do)
    assert all(bool(t.isfinite().all()) for t in flagged)
    assert all(torch.equal(a, b) for a, b in zip(flagged, plain))


# What an Override switches must be as accurate and as reproducible as what select picks.
# Cases: rows that see no key (seqlen_q > seqlen_k, causal: their dQ tiles get no contribution),
# GQA, odd sizes, every head_dim.
OVERRIDE_CASES = [(1, 4, 4, 300, 100, 128, True), (2, 8, 2, 257, 257, 128, False),
                  (1, 4, 4, 333, 333, 128, True), (2, 6, 2, 300, 257, 96, True),
                  (1, 4, 4, 300, 100, 64, True), (2, 4, 1, 200, 333, 64, False)]
OVERRIDES = ["fused_convert", "early_kv", "persistent_forward", "dq_last"]


def picked(case: Case, sm_count: int, schedule: str, num_workers: int) -> dict:
    """What select picks for the case: {override name: its value}."""
    q, k = tuple(case.q.shape), tuple(case.k.shape)
    dtype = "bf16" if case.q.dtype == torch.bfloat16 else "fp16"
    sel = selection(q, k, dtype, case.causal, True, False, schedule, num_workers, sm_count,
                    Overrides())
    fwd = forward_variant(q, k, dtype, case.causal, sm_count, Overrides())
    return dict(fused_convert=sel.backward.fused_convert, early_kv=sel.backward.early_kv,
                persistent_forward=fwd.persistent, dq_last=sel.backward.dq_last)


@pytest.mark.parametrize("name", OVERRIDES)
@pytest.mark.parametrize("shape", OVERRIDE_CASES, ids=lambda s: "-".join(map(str, s)))
def test_overridden_policies_match_float64_and_repeat_bitwise(name, shape, sm_count, seed):
    """Each policy switched from what select picks for the case."""
    if name == "dq_last" and kernel_head_dim(shape[5]) not in DQ_LAST_HEAD_DIMS:
        pytest.skip(f"dq_last serves head_dim {DQ_LAST_HEAD_DIMS}")
    case = Case(*shape)
    for schedule, workers in (("fa3", min(132, sm_count)), ("auto", min(132, sm_count))):
        flipped = Overrides(**{name: not picked(case, sm_count, schedule, workers)[name]})
        first = case.run(flipped, schedule, workers)
        bad = case.errors(first, dict(schedule=schedule, overrides=flipped))
        assert not bad, "\n".join(bad)
        again = case.run(flipped, schedule, workers)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("names", ["fused_convert", "early_kv", "fused_convert,early_kv",
                                   "persistent_forward", "dq_last", "dq_last,early_kv"])
@pytest.mark.parametrize("shape", OVERRIDE_CASES, ids=lambda s: "-".join(map(str, s)))
def test_the_policies_change_no_bits(names, shape, sm_count, seed):
    """fused_convert applies the convert kernel's conversion to the same final sums, inside the
    main kernel; early_kv only loads a segment's K/V sooner; dq_last issues the same wgmmas in
    another order and hands dQ off later; the persistent forward runs the
    one-tile kernel's per-tile code on fewer CTAs. Every value comes from the same operations,
    so the bits must not move."""
    if "dq_last" in names and kernel_head_dim(shape[5]) not in DQ_LAST_HEAD_DIMS:
        pytest.skip(f"dq_last serves head_dim {DQ_LAST_HEAD_DIMS}")
    case = Case(*shape)
    workers = min(132, sm_count)
    results = [case.run(Overrides(**dict.fromkeys(names.split(","), value)), "auto", workers)
               for value in (False, True)]
    assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("shape", OVERRIDE_CASES, ids=lambda s: "-".join(map(str, s)))
def test_two_dq_writers_change_no_bits(shape, sm_count, seed):
    """Two dQ writer lanes (Overrides(dq_writers=2), a buffer each) make the same adds onto
    each tile in the same rank order as one writer: the bits must not move, under every kind of
    schedule, and the result stays within float64's tolerance."""
    if kernel_head_dim(shape[5]) not in DQ_WRITERS_KERNEL_HEAD_DIMS:
        pytest.skip(f"two dQ writers: the kernels of head_dim {DQ_WRITERS_KERNEL_HEAD_DIMS}")
    case = Case(*shape)
    workers = min(132, sm_count)
    for schedule in ("fa3", "auto", "spt_listed"):
        two = Overrides(dq_writers=2)
        results = [case.run(overrides, schedule, workers)
                    for overrides in (Overrides(dq_writers=1), two, two)]
        bad = case.errors(results[1], dict(schedule=schedule, overrides=two))
        assert not bad, "\n".join(bad)
        for other in results[1:]:
            assert all(torch.equal(a, b) for a, b in zip(results[0], other)), schedule
    if kernel_head_dim(shape[5]) == 128:
        # With dq_last (the long rows' pick beside two writers): the same bits again.
        last = [case.run(Overrides(dq_writers=w, dq_last=True), "auto", workers)
                for w in (1, 2)]
        assert all(torch.equal(a, b) for a, b in zip(*last))
    # The unordered kernel with two writers: its adds land in any order, within tolerance.
    unordered = case.run(two, "auto", workers, deterministic=False)
    bad = case.errors(unordered, dict(overrides=two, deterministic=False))
    assert not bad, "\n".join(bad)


def test_two_dq_writers_change_no_bits_under_a_soft_cap(sm_count, seed):
    """The soft-capped kernel with two writers (asked for through Overrides: select keeps one
    under a cap until they are timed there): the cap changes the scores only, so one writer's
    bits."""
    case = Case(2, 8, 2, 300, 257, 128, True)
    results = []
    for writers in (1, 2, 2):
        overrides = Overrides(dq_writers=writers)
        o, lse = forward(case.q, case.k, case.v, causal=True, softmax_scale=case.scale,
                         overrides=overrides, softcap=20.0)
        results.append((o, *backward(case.do, case.q, case.k, case.v, o, lse, causal=True,
                                     softmax_scale=case.scale, deterministic=True,
                                     schedule="auto", num_workers=min(132, sm_count),
                                     overrides=overrides, softcap=20.0)))
    capped_o = results[0][0]
    uncapped_o, _ = forward(case.q, case.k, case.v, causal=True, softmax_scale=case.scale)
    assert not torch.equal(capped_o, uncapped_o)  # the cap took effect
    for other in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(results[0], other))


# -- (b) bitwise determinism -------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_defaults_are_its_schedule_on_balanced_workers(causal, sm_count, seed):
    """attention() with schedule="auto", num_workers=None gives the bits of its schedule run on
    any worker count: the balanced one auto launches, and the SM count."""
    q, k, v = (torch.randn(2, 1024, 8, 64, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    problem = problem_for(2, 8, 8, 1024, 1024, 64, causal)
    name = "symmetric_shift" if causal else "shift"
    workers = balanced_workers(problem, BUILDERS[name].units(Tiling(problem)), sm_count)
    assert workers <= sm_count
    grads = [torch.autograd.grad(attention(q, k, v, causal=causal, deterministic=True, **kw), (q, k, v), do)
             for kw in ({}, dict(schedule=name, num_workers=workers),
                        dict(schedule=name, num_workers=sm_count))]
    assert all(torch.equal(a, b) for a, b in zip(*grads[:2]))
    assert all(torch.equal(a, b) for a, b in zip(*grads[1:]))


REPEATS = 1000


@pytest.mark.parametrize("causal, schedule, worker_dependent, head_dim", [
    (False, "fa3", False, 128), (False, "shift", True, 128),
    (True, "spt", False, 128), (True, "symmetric_shift", True, 128), (True, "spt_listed", False, 128),
    (True, "spt_listed", False, 96), (False, "shift", True, 96),
], ids=["full-fa3", "full-shift", "causal-spt", "causal-symmetric_shift", "causal-spt_listed",
        "causal-spt_listed-d96", "full-shift-d96"])
def test_backward_is_bitwise_reproducible_while_another_stream_keeps_the_gpu_busy(
        causal, schedule, worker_dependent, head_dim, sm_count, seed):
    q, k, v = (torch.randn(2, 1000, h, head_dim, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for h in (16, 4, 4))
    do = torch.randn_like(q)
    o = attention(q, k, v, causal=causal, schedule=schedule, deterministic=True,
                  num_workers=sm_count if worker_dependent else None)
    grad = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    mismatches = busy_mismatches(grad, grad(), REPEATS)
    assert not mismatches, \
        f"{len(mismatches)} of {REPEATS} calls differed, first at {mismatches[:5]}"


def busy_mismatches(grad, first, repeats: int) -> list[int]:
    """The calls of `grad` (of `repeats`) whose tensors differ from `first`, while matmuls on a
    second stream take SMs and L2 away at varying moments, so the workers' arrival order at
    each dQ tile changes from call to call; the bits must not."""
    a, b = (torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())  # a and b are ready before the side uses them
    mismatches = []
    for i in range(repeats):
        with torch.cuda.stream(side):
            for _ in range(i % 3):
                a @ b
        if not all(torch.equal(x, y) for x, y in zip(grad(), first)):
            mismatches.append(i)
        if i % 64 == 63:
            side.synchronize()  # keep the side queue short
    side.synchronize()
    return mismatches


@pytest.mark.parametrize("workers", [7, 131])
def test_a_listed_deal_keeps_its_policys_bits(workers, sm_count, seed):
    """spt_listed runs spt's ranks on another deal: the same bits as spt on any worker count
    (GQA, several sequences, so the deal crosses sequence boundaries)."""
    q, k, v = (torch.randn(3, 1500, h, 128, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for h in (8, 2, 2))
    do = torch.randn_like(q)
    grads = []
    for schedule, count in (("spt", min(132, sm_count)), ("spt_listed", min(workers, sm_count))):
        o = attention(q, k, v, causal=True, schedule=schedule, deterministic=True,
                      num_workers=count)
        grads.append((o, *torch.autograd.grad(o, (q, k, v), do)))
    assert all(torch.equal(a, b) for a, b in zip(*grads))


# -- (c) the kernel runs the schedule it was given ---------------------------------------------

TRACE_PROBLEMS = [
    dict(batch=2, heads_q=4, heads_kv=4, seqlen_q=257, seqlen_k=257, head_dim=64, causal=False),
    dict(batch=1, heads_q=8, heads_kv=2, seqlen_q=1000, seqlen_k=1000, head_dim=128, causal=True),
    dict(batch=2, heads_q=16, heads_kv=1, seqlen_q=100, seqlen_k=257, head_dim=64, causal=True),
    dict(batch=1, heads_q=2, heads_kv=2, seqlen_q=300, seqlen_k=130, head_dim=128, causal=False),
]


@pytest.mark.parametrize("shape", TRACE_PROBLEMS,
                         ids=lambda s: "-".join(str(v) for v in s.values()))
def test_trace_equals_schedule_ir(shape, sm_count, seed):
    problem = problem_for(shape["batch"], shape["heads_q"], shape["heads_kv"], shape["seqlen_q"],
                          shape["seqlen_k"], shape["head_dim"], shape["causal"])
    causal = shape["causal"]
    make = lambda s, h: torch.randn(problem.batch, s, h, problem.head_dim, device="cuda",
                                    dtype=torch.bfloat16)
    q, k, v = make(problem.seqlen_q, problem.heads_q), make(problem.seqlen_k, problem.heads_kv), \
        make(problem.seqlen_k, problem.heads_kv)
    do = torch.randn_like(q)
    scale = problem.head_dim ** -0.5
    o, lse = forward(q, k, v, causal=causal, softmax_scale=scale)
    for name in list_schedules():
        if unsupported_reason(name, problem) is not None:
            continue
        for workers in (min(132, sm_count), SMALL_ODD_WORKERS):
            if workers < BUILDERS[name].min_workers(problem):
                continue
            schedule = build_schedule(name, problem, workers)
            expected = torch.tensor([[t.batch, t.head, t.n_block, t.m_block, t.dq_rank]
                                     for tasks in schedule.workers for t in tasks],
                                    dtype=torch.int32)
            *_, trace = backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                                 deterministic=True, schedule=name, num_workers=workers,
                                 trace=True)
            trace = trace.cpu()
            where = f"{name} with {workers} workers"
            assert trace.shape == (len(expected), TRACE_COLUMNS), where
            rows = (trace[:, :5] != expected).any(1).nonzero().flatten().tolist()
            assert not rows, (f"{where}: {len(rows)} trace rows differ from the IR, first row "
                              f"{rows[0]}: ran {trace[rows[0]].tolist()}, "
                              f"IR {expected[rows[0]].tolist()}")
            assert torch.equal(trace[:, 5], trace[:, 4]), \
                f"{where}: a dQ add saw a counter other than its dq_rank"
            check_trace_times(trace, schedule, where)


def _since(later: torch.Tensor, earlier: torch.Tensor) -> torch.Tensor:
    """later - earlier for the low 32 bits of a clock (wrapping), as signed 64-bit."""
    return (later.long() - earlier.long()) % 2**32


def check_trace_times(trace: torch.Tensor, schedule, where: str) -> None:
    """The trace's stamps (variants.TRACE_COLUMNS) tell the dQ hand-offs' story in order: each
    writer had a partial, then the counter, then its add landed, task after task; and no add
    acquired its counter before the add ranked just before it (on another SM) had landed."""
    ready, acquired, landed = 6, 7, 8
    for first, second in ((ready, acquired), (acquired, landed)):
        for offset, name in ((0, "SM clock"), (3, "global timer")):
            gap = _since(trace[:, second + offset], trace[:, first + offset])
            assert int(gap.max()) < 2**31, f"{where}: {name} runs backwards within a hand-off"
    start = 0
    for tasks in schedule.workers:  # each writer hands its tasks off one after another
        rows = trace[start:start + len(tasks)]
        start += len(tasks)
        if len(tasks) > 1:
            gap = _since(rows[1:, ready + 3], rows[:-1, landed + 3])
            assert int(gap.max()) < 2**31, f"{where}: a writer took a task before the last landed"
    previous = {(int(b), int(h), int(m), int(r)): i
                for i, (b, h, _, m, r) in enumerate(trace[:, :5].tolist())}
    late = [i for i, (b, h, _, m, r) in enumerate(trace[:, :5].tolist()) if r > 0 and
            int(_since(trace[i, acquired + 3], trace[previous[(b, h, m, r - 1)], landed + 3]))
            >= 2**31]
    assert not late, f"{where}: {len(late)} adds acquired their counter before rank - 1 landed"


# -- (d) torch.compile and the op registration -------------------------------------------------

@pytest.mark.parametrize("fullgraph", [False, True])
def test_torch_compile_matches_eager_bitwise(fullgraph, seed):
    torch._dynamo.reset()
    q, k, v = (torch.randn(2, 257, h, 128, device="cuda", dtype=torch.bfloat16)
               for h in (8, 2, 2))
    do = torch.randn_like(q)
    fn = lambda q, k, v: attention(q, k, v, causal=True, deterministic=True)
    eager = out_and_grads(fn, q, k, v, do)
    compiled = out_and_grads(torch.compile(fn, fullgraph=fullgraph), q, k, v, do)
    torch._dynamo.reset()
    assert all(torch.equal(a, b) for a, b in zip(eager, compiled))


def test_opcheck_with_the_real_kernels(seed):
    q, k, v = (torch.randn(2, 257, h, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for h in (8, 2, 2))
    args = (q, k, v, True, 0.125, True, "spt", 7)
    torch.library.opcheck(torch.ops.dashgen.attention_fwd.default, args)
    o, lse = torch.ops.dashgen.attention_fwd(q.detach(), k.detach(), v.detach(), *args[3:])
    torch.library.opcheck(torch.ops.dashgen.attention_bwd.default,
                          (torch.randn_like(o), q.detach(), k.detach(), v.detach(), o, lse,
                           *args[3:]))


# -- (e) errors that need the real device ------------------------------------------------------

def test_more_workers_than_sms_is_refused(sm_count):
    q = torch.randn(1, 128, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=rf"^num_workers={sm_count + 1} exceeds this GPU's "
                                         rf"{sm_count} SMs"):
        attention(q, q, q, num_workers=sm_count + 1)


def test_a_shift_schedule_below_one_sequences_units_is_refused():
    # 1024 keys: 8 KV tiles of one sequence, which shift runs all at once
    q = torch.randn(1, 1024, 2, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^num_workers: schedule 'shift' needs at least 8"):
        attention(q, q, q, schedule="shift", num_workers=7)
