"""The backward's host path without a GPU: runtime.backward on CPU tensors with the driver
replaced by a recorder. The kernels compile for real (NVRTC); what is checked is what reaches
cuLaunchKernel: which kernels, in which order, and that every pointer in their parameter blocks
is the workspace part or tensor it must be. Kernel variants are chosen by
dashgen.runtime.select; Overrides pin a policy where a test needs one path."""
from __future__ import annotations

import ctypes
import itertools
import math

import pytest

torch = pytest.importorskip("torch")

from dashgen.caches import Memo, clear_caches  # noqa: E402
from dashgen.codegen.variants import (BACKWARD_CONSTANTS, BwdParams,  # noqa: E402
                                      ConvertParams, FwdParams, PrepParams)
from dashgen.runtime import backward as runtime  # noqa: E402
from dashgen.runtime import forward as runtime_forward  # noqa: E402
from dashgen.runtime import checks, launch, op, varlen, workspace  # noqa: E402
from dashgen.runtime.select import Overrides  # noqa: E402

SEPARATE_CONVERT = Overrides(fused_convert=False)  # the convert kernel writes dQ
FUSED_CONVERT = Overrides(fused_convert=True)


class FakeMap:
    """A tensor-map stand-in whose address says which tensor it describes."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def getPtr(self):  # noqa: N802 (cuda-bindings' name)
        return 0x7000_0000 + self.ptr % 0x1000_0000


class Recorder:
    """libcuda's three entry points the runtime calls; launches decoded on the spot (the
    runtime's parameter blocks live only during the call)."""

    def __init__(self, names: dict[int, str]):
        self.names = names
        self.launches: list[tuple[str, tuple, list]] = []

    def cuCtxGetCurrent(self, out):  # noqa: N802
        out._obj.value = 1
        return 0

    def cuCtxSetCurrent(self, ctx):  # noqa: N802
        return 0

    def cuLaunchKernel(self, handle, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802
        name = self.names[handle]
        addresses = list(params)
        if name.startswith("dashgen_fwd_"):  # three tensor maps, then the block
            args = addresses[:-1] + [FwdParams.from_address(addresses[-1])]
        elif name.endswith("_preprocess"):
            args = [PrepParams.from_address(addresses[0])]
        elif name.endswith("_convert"):
            args = [ConvertParams.from_address(addresses[0])]
        elif name.endswith("_plan"):  # a pack's plan kernel: the backward's block alone
            args = [BwdParams.from_address(addresses[0])]
        else:  # the backward: four tensor maps, then the block
            args = addresses[:4] + [BwdParams.from_address(addresses[4])]
        # Copy the structures: their memory is gone after the call.
        args = [type(a).from_buffer_copy(a) if isinstance(a, ctypes.Structure) else a
                for a in args]
        self.launches.append((name, (gx, gy, gz), args))
        return 0


@pytest.fixture
def recorder(monkeypatch):
    """The driver replaced; the kernels compile for real (through the test run's cache)."""
    names: dict[int, str] = {}

    def load_kernel(cubin, name):
        names[len(names) + 1] = name
        return launch.Kernel(name, None, len(names))

    rec = Recorder(names)
    monkeypatch.setattr(launch, "ensure_context", lambda device=0: None)
    monkeypatch.setattr(launch, "load_kernel", load_kernel)
    monkeypatch.setattr(launch.Kernel, "set_max_dynamic_shared_bytes", lambda self, n: None)
    monkeypatch.setattr(launch, "encode_tensor_map", lambda ptr, *a, **k: FakeMap(ptr))
    monkeypatch.setattr(launch, "_LIBCUDA", rec)
    monkeypatch.setitem(launch._PRIMARY, 0, 1)
    for module in (runtime, runtime_forward):
        monkeypatch.setattr(module, "stream", lambda device: 0)
        monkeypatch.setattr(module, "sm_count", lambda device: 132)
    monkeypatch.setattr(varlen, "stream", lambda device: 0)
    clear_caches()
    yield rec
    clear_caches()


def inputs(heads_q, heads_kv, seqlen=200, head_dim=128):
    q, do, o = (torch.randn(1, seqlen, heads_q, head_dim, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(1, seqlen, heads_kv, head_dim, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(1, heads_q, seqlen)
    return do, q, k, v, o, lse


@pytest.mark.parametrize("path", ["backward", "second call"])
@pytest.mark.parametrize("heads_kv", [4, 1], ids=["mha", "gqa"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_backward_launches_carry_the_right_pointers(recorder, heads_kv, deterministic, path):
    """runtime.backward, or the second call of one prepared BackwardCall with another dO: a
    prepared call rewrites every pointer that changes between calls."""
    do, q, k, v, o, lse = args = inputs(4, heads_kv)
    options = dict(causal=True, softmax_scale=0.1, deterministic=deterministic, schedule="fa3",
                   num_workers=3, overrides=SEPARATE_CONVERT)
    if path == "backward":
        dq, dk, dv = runtime.backward(*args, **options)
    else:
        call = runtime.BackwardCall(q, k, v, o, lse, **options)
        first = call(torch.randn_like(do))  # kept: the second call's buffers are new ones
        recorder.launches.clear()
        dq, dk, dv = call(do)
        assert not any(a.data_ptr() == b.data_ptr() for a, b in zip(first, (dq, dk, dv)))
    gqa = heads_kv != 4
    kinds = [name.rsplit("_", 1)[-1] if name.endswith(("_preprocess", "_convert")) else "main"
             for name, _, _ in recorder.launches]
    assert kinds == ["preprocess", "main", "convert"] + (["convert"] * 2 if gqa else [])
    (_, _, (prep,)), (_, grid, main_args), (_, _, (convert_q,)) = recorder.launches[:3]
    params = main_args[4]
    assert grid == (3, 1, 1)  # one CTA per worker

    # The tensor maps describe q, k, v and dO, in that order.
    assert main_args[:4] == [FakeMap(t.data_ptr()).getPtr() for t in (q, k, v, do)]
    assert (params.q, params.k, params.v, params.dout, params.lse) == tuple(
        t.data_ptr() for t in (q, k, v, do, lse))
    # Outputs: dK/dV straight from the main kernel, or through fp32 sums and two converts.
    if gqa:
        assert params.dk is None and params.dv is None
        assert [a[0].dst for _, _, a in recorder.launches[3:]] == [dk.data_ptr(), dv.data_ptr()]
        assert [a[0].src for _, _, a in recorder.launches[3:]] == [params.dk_accum,
                                                                  params.dv_accum]
    else:
        assert (params.dk, params.dv) == (dk.data_ptr(), dv.data_ptr())
        assert params.dk_accum is None and params.dv_accum is None
    assert convert_q.dst == dq.data_ptr() and convert_q.src == params.dq_accum
    assert convert_q.swizzled == 1

    # The preprocess writes what the main kernel reads; the dQ sums are zeroed unless the first
    # deterministic writer stores (docs/design.md, first-dq-store), and then the convert reads
    # the counters to find tiles nobody wrote.
    assert (prep.o, prep.dout) == (o.data_ptr(), do.data_ptr())
    assert prep.dpsum == params.dpsum and prep.dq_accum == params.dq_accum
    # D is stored scaled by the softmax scale the main kernel uses for dS (0 would zero it).
    assert prep.d_scale == pytest.approx(0.1) and params.softmax_scale == pytest.approx(0.1)
    assert prep.zero_dq == (0 if deterministic else 1)
    assert convert_q.counters == (params.dq_counters if deterministic else None)
    # Staged statistics: both kernels carry the same stats part.
    assert prep.stats == params.stats and prep.stats is not None

    # Every workspace pointer lies in one allocation, the zeroed tail covering the counters.
    parts = [params.dq_accum, params.dpsum, params.dq_counters]
    base = min(parts)
    assert all((ptr - base) % 16 == 0 for ptr in parts)
    assert prep.zero <= params.dq_counters < prep.zero + 16 * prep.zero_vec4s
    assert params.seqlen_q == 200 and params.num_m_blocks == math.ceil(200 / 64)


@pytest.mark.parametrize("head_dim, causal", sorted(BACKWARD_CONSTANTS))
def test_staged_stats_reach_the_preprocess_and_the_main_kernel(recorder, head_dim, causal):
    """docs/design.md, staged-stats: the preprocess lays the statistics out where the main
    kernel reads them."""
    do, q, k, v, o, lse = args = inputs(4, 4, head_dim=head_dim)
    runtime.backward(*args, causal=causal, softmax_scale=0.1, deterministic=True,
                     schedule="fa3", num_workers=3)
    (_, _, (prep,)), (name, _, main_args) = recorder.launches[:2]
    params = main_args[4]
    assert name.startswith(f"dashgen_bwd_bf16_d{head_dim}_")
    assert prep.stats == params.stats and prep.stats is not None
    assert prep.lse == lse.data_ptr()
    assert params.stats % 16 == 0
    # After dQ's sums and D, before what the preprocess zeroes.
    assert params.dpsum < params.stats < prep.zero


@pytest.fixture
def deterministic_algorithms():
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)
    torch.utils.deterministic.fill_uninitialized_memory = True


def spy_allocations(monkeypatch) -> list[tuple[str, bool]]:
    """(which allocator, the global fill setting at that moment) for each buffer the runtime
    allocates."""
    seen = []
    for name in ("_empty", "_empty_unfilled"):
        real = getattr(workspace, name)
        monkeypatch.setattr(workspace, name, lambda *a, _real=real, _name=name: (
            seen.append((_name, torch.utils.deterministic.fill_uninitialized_memory)),
            _real(*a))[1])
    return seen


@pytest.mark.parametrize("flag", [True, False])
def test_buffers_skip_the_deterministic_fill(recorder, monkeypatch, deterministic_algorithms,
                                             flag):
    """Under torch.use_deterministic_algorithms(True) torch.empty fills with NaN; the runtime's
    buffers are written by its kernels, so it allocates them without the fill, and without
    touching the global setting (other threads' tensors keep their fill)."""
    if not flag:
        torch.use_deterministic_algorithms(False)
    seen = spy_allocations(monkeypatch)
    args = inputs(4, 4)
    runtime.backward(*args, causal=True, softmax_scale=0.1, deterministic=True, schedule="fa3",
                     num_workers=3)
    expected = "_empty_unfilled" if flag else "_empty"
    assert len(seen) >= 4  # the workspace, dq, dk, dv
    assert seen == [(expected, True)] * len(seen)
    del seen[:]
    monkeypatch.setattr(recorder, "cuLaunchKernel", lambda *a: 0)  # it decodes backwards only
    o, lse = runtime_forward.forward(*args[1:4], causal=True, softmax_scale=0.1)
    assert seen == [(expected, True)] * 2
    assert o.shape == args[1].shape and o.dtype == args[1].dtype and o.is_contiguous()
    assert lse.shape == (1, 4, 200) and lse.dtype == torch.float32


def test_an_unfilled_buffer_is_an_ordinary_tensor(deterministic_algorithms):
    t = workspace._empty_unfilled((3, 5, 7), torch.bfloat16, torch.device("cpu"))
    assert t.shape == (3, 5, 7) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.untyped_storage().nbytes() == 3 * 5 * 7 * 2
    t.fill_(1.5)
    assert bool((t == 1.5).all())


def test_tensor_maps_are_looked_up_once_per_address_set(recorder, monkeypatch):
    calls = []
    encode = launch.encode_tensor_map
    monkeypatch.setattr(launch, "encode_tensor_map",
                        lambda ptr, *a, **k: calls.append(ptr) or encode(ptr, *a, **k))
    clear_caches()
    args = inputs(4, 4)
    for _ in range(3):
        runtime.backward(*args, causal=True, softmax_scale=0.1, deterministic=True,
                         schedule="fa3", num_workers=3)
    assert len(calls) == 4  # q, k, v and dO, encoded on the first call only
    moved = [t.clone() for t in args]
    runtime.backward(*moved, causal=True, softmax_scale=0.1, deterministic=True,
                     schedule="fa3", num_workers=3)
    assert len(calls) == 8 and calls[4:] == [moved[i].data_ptr() for i in (1, 2, 3, 0)]


def expected_counts(seqlen_k, seqlen_q=200):
    """Causal, bottom-right aligned: 64-row tile m sees keys up to 64 m + 63 + seqlen_k - seqlen_q,
    one contribution per 128-key tile."""
    return [max(0, min(math.ceil(seqlen_k / 128), (64 * m + 63 + seqlen_k - seqlen_q) // 128 + 1))
            for m in range(math.ceil(seqlen_q / 64))]


@pytest.mark.parametrize("seqlen_k, convert", [(200, False), (64, True)])
def test_fused_convert_hands_dq_to_the_main_kernel(recorder, seqlen_k, convert):
    """With fused_convert the main kernel gets dQ (which tiles it converts and their counts are
    formulas: tests/test_policy_header.py), and the convert kernel runs only where some query
    tile gets no contribution (causal, 200 query rows against 64 keys: the first two 64-row
    tiles see no key)."""
    do, q, k, v, o, lse = inputs(4, 4)
    k, v = k[:, :seqlen_k].contiguous(), v[:, :seqlen_k].contiguous()
    dq, dk, dv = runtime.backward(do, q, k, v, o, lse, causal=True, softmax_scale=0.1,
                                  deterministic=True, schedule="fa3", num_workers=3,
                                  overrides=FUSED_CONVERT)
    kinds = [name.rsplit("_", 1)[-1] if name.endswith(("_preprocess", "_convert")) else "main"
             for name, _, _ in recorder.launches]
    assert kinds == ["preprocess", "main"] + (["convert"] if convert else [])
    name, _, main_args = recorder.launches[1]
    params = main_args[4]
    assert "_fconv" in name
    assert params.dq == dq.data_ptr()
    assert params.tasks is None and params.worker_offsets is None  # fa3's policy: no table
    assert convert == (min(expected_counts(seqlen_k)) == 0)
    if convert:
        assert recorder.launches[2][2][0].dst == dq.data_ptr()


@pytest.mark.parametrize("heads, num_workers, fused", [(16, 132, True), (1, 1, False)])
def test_fused_convert_is_decided_per_problem_by_default(recorder, heads, num_workers, fused):
    """Without an override: on where the convert kernel would take longer than the converter
    costs the main kernel (select.fuses_convert, on the runtime's cached plan): few tasks per
    worker. There a non-deterministic call runs the ordered kernel too; elsewhere its own."""
    args = inputs(heads, heads)
    for deterministic in (True, False):
        runtime.backward(*args, causal=False, softmax_scale=0.1, deterministic=deterministic,
                         schedule="fa3", num_workers=num_workers)
        name = recorder.launches[1][0]
        assert ("_fconv" in name) == fused, name
        assert ("_nondet" in name) == (not deterministic and not fused), name
        recorder.launches.clear()


@pytest.mark.parametrize("seqlen, early", [(200, True), (4096, True), (4097, False)])
def test_early_kv_is_decided_per_problem_by_default(recorder, seqlen, early):
    """Without an override: on where the sequence has at most 32 KV tiles
    (select.early_kv_pays): 2 at seqlen 200, 32 at 4096, 33 at 4097; an override decides
    either way."""
    for deterministic in (True, False):
        runtime.backward(*inputs(4, 4, seqlen=seqlen), causal=False, softmax_scale=0.1,
                         deterministic=deterministic, schedule="fa3", num_workers=3)
        assert ("_ekv" in recorder.launches[1][0]) == early
        recorder.launches.clear()
        runtime.backward(*inputs(4, 4, seqlen=seqlen), causal=False, softmax_scale=0.1,
                         deterministic=deterministic, schedule="fa3", num_workers=3,
                         overrides=Overrides(early_kv=not early))
        assert ("_ekv" in recorder.launches[1][0]) == (not early)
        recorder.launches.clear()


def test_a_non_deterministic_call_with_dq_converted_in_the_kernel_runs_the_ordered_one(recorder):
    """Only the ordered kernel knows when a dQ sum is final, so where dQ is converted in the main
    kernel, deterministic=False runs it: no accumulator zeroing, no convert kernel."""
    dq, _, _ = runtime.backward(*inputs(4, 4), causal=True, softmax_scale=0.1,
                                deterministic=False, schedule="fa3", num_workers=3,
                                overrides=FUSED_CONVERT)
    (prep, _, prep_args), (name, _, main_args) = recorder.launches
    assert prep.endswith("_preprocess") and "_det_fconv" in name
    assert prep_args[0].zero_dq == 0 and main_args[4].dq == dq.data_ptr()


def _without_addresses(launches) -> list:
    """Names, grids and the blocks' fields but their addresses (a call's own buffers)."""
    return [(name, grid, [tuple((f, getattr(a, f)) for f, kind in a._fields_
                                if kind is not ctypes.c_void_p)
                          for a in args if isinstance(a, ctypes.Structure)])
            for name, grid, args in launches]


@pytest.mark.parametrize("heads_kv", [4, 1], ids=["mha", "gqa"])
def test_where_dq_converts_in_the_kernel_both_modes_launch_the_same(recorder, heads_kv):
    launched = {}
    for deterministic in (True, False):
        runtime.backward(*inputs(4, heads_kv), causal=True, softmax_scale=0.1,
                         deterministic=deterministic, schedule="fa3", num_workers=3,
                         overrides=FUSED_CONVERT)
        launched[deterministic] = _without_addresses(recorder.launches)
        recorder.launches.clear()
    assert launched[True] == launched[False] and len(launched[True]) >= 2


def test_the_unordered_kernel_zeroes_the_accumulator_and_converts_after(recorder):
    runtime.backward(*inputs(4, 4), causal=True, softmax_scale=0.1, deterministic=False,
                     schedule="fa3", num_workers=3, overrides=Overrides(fused_convert=False))
    assert len(recorder.launches) == 3 and recorder.launches[2][0].endswith("_convert")
    (_, _, prep_args), (name, _, main_args) = recorder.launches[:2]
    assert "_nondet" in name and prep_args[0].zero_dq == 1
    assert main_args[4].dq is None and main_args[4].tasks is None


def schedule_file(seqlen=200, heads=4):
    """A verified schedule that is not its name's policy (fa3's, renamed): the table path."""
    from dashgen import build_schedule
    from dashgen.runtime.select import problem_for
    from dashgen.runtime.tables import register
    schedule = build_schedule("fa3", problem_for(1, heads, heads, seqlen, seqlen, 128, True), 3)
    schedule.name = "edited"
    return register(schedule)


def test_a_named_schedule_holds_no_table_and_a_schedule_file_its_own(recorder):
    kw = dict(causal=True, softmax_scale=0.1, deterministic=True, num_workers=3)
    runtime.backward(*inputs(4, 4, seqlen=200), schedule="fa3", **kw)
    name, _, args = recorder.launches[1]
    assert "_fa3_" in name and args[4].tasks is None and args[4].worker_offsets is None
    recorder.launches.clear()
    key = schedule_file()
    runtime.backward(*inputs(4, 4, seqlen=200), schedule=key, **kw)
    name, _, args = recorder.launches[1]
    (bl,) = [value for value, _ in runtime.backward_launch._entries.values()
             if value.tables]
    assert "_table_" in name and args[4].tasks == bl.tasks.data_ptr()
    assert args[4].worker_offsets == bl.offsets.data_ptr()
    from dashgen.runtime.tables import table_of
    assert bl.tasks.numel() == 4 * table_of(key).num_tasks  # 16 bytes a task
    assert bl.offsets.tolist() == [0, *itertools.accumulate(map(len, table_of(key).workers))]


def test_prepared_launches_are_bounded_by_their_tables_bytes(recorder, monkeypatch):
    """A schedule file's launch holds its task table on the device; past the byte budget the
    oldest signature is dropped (and rebuilt if it comes back)."""
    cache = runtime.backward_launch
    kw = dict(causal=True, softmax_scale=0.1, deterministic=True, num_workers=3)
    runtime.backward(*inputs(4, 4, seqlen=200), schedule=schedule_file(200), **kw)
    one = cache.cache_bytes()
    assert len(cache) == 1 and one >= 16 * 4  # at least the task table, 16 bytes a task
    monkeypatch.setattr(cache, "max_bytes", one)
    runtime.backward(*inputs(4, 4, seqlen=300), schedule=schedule_file(300), **kw)
    assert len(cache) == 1 and cache.cache_bytes() > one  # the 200-token launch went
    monkeypatch.setattr(cache, "max_bytes", 1 << 30)
    runtime.backward(*inputs(4, 4, seqlen=200), schedule=schedule_file(200), **kw)
    assert len(cache) == 2 and cache.cache_bytes() > 2 * one


@pytest.mark.parametrize("call_stream, recorded", [(0, False), (1, True)])
def test_tables_record_their_use_on_another_stream(recorder, monkeypatch, call_stream,
                                                   recorded):
    """A schedule file's task table and worker offsets are recorded on the call's stream when
    they were allocated on another one, so a dropped launch's memory is not reused under kernels
    still queued."""
    kw = dict(causal=True, softmax_scale=0.1, deterministic=True, num_workers=3,
              schedule=schedule_file(), overrides=FUSED_CONVERT)
    runtime.backward(*inputs(4, 4), **kw)  # built on the CPU's stream 0
    (bl,) = [value for value, _ in runtime.backward_launch._entries.values()]
    assert bl.converts_dq
    tables = [bl.tasks, bl.offsets]
    seen = []
    monkeypatch.setattr(runtime, "stream", lambda device: call_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: "the call's stream")
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda self, stream: seen.append((self.data_ptr(), stream)))
    runtime.backward(*inputs(4, 4), **kw)
    expected = [(t.data_ptr(), "the call's stream") for t in tables] if recorded else []
    assert sorted(seen) == sorted(expected)


@pytest.fixture
def cpu_op(monkeypatch):
    """dashgen.attention on CPU tensors (H200 facts), over the recorded driver."""
    monkeypatch.setattr(checks, "_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(checks, "_device_facts", lambda index: (9, 0, 132, "NVIDIA H200"))
    built = []
    real = runtime.BackwardCall
    # The spy keeps addresses, never the tensors (a test below checks what stays alive).
    monkeypatch.setattr(runtime, "BackwardCall", lambda *a, **kw: built.append(
        tuple(t.data_ptr() for t in a)) or real(*a, **kw))
    monkeypatch.setattr(op, "_KERNELS", None)  # op._kernels() picks up the spy
    yield built


def leaf_inputs(seqlen=200, heads=4, head_dim=128):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, seqlen, heads, head_dim, dtype=torch.bfloat16).requires_grad_()
               for _ in range(3))
    return q, k, v, torch.randn(1, seqlen, heads, head_dim, dtype=torch.bfloat16)


def main_and_prep(launches):
    prep = next(a[0] for name, _, a in launches if name.endswith("_preprocess"))
    main = next(a for name, _, a in launches
                if name.startswith("dashgen_bwd_") and not name.endswith(("_preprocess",
                                                                               "_convert")))
    return prep, main


def test_the_eager_backward_is_prepared_by_its_forward(recorder, cpu_op):
    """attention()'s autograd node builds the backward's launches in the forward, once; its
    backward launches with the forward's tensors and the dO it is handed, every time."""
    q, k, v, do = leaf_inputs()
    out = op.attention(q, k, v, causal=True, schedule="fa3")
    (name, _, fwd_args), = recorder.launches
    fwd = fwd_args[-1]
    assert len(cpu_op) == 1 and (fwd.q, fwd.o) == (q.data_ptr(), out.data_ptr())
    for grad_out in (do, do.flip(0).contiguous()):
        recorder.launches.clear()
        torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)
        prep, main = main_and_prep(recorder.launches)
        params = main[4]
        assert (params.q, params.k, params.v, params.lse) == (q.data_ptr(), k.data_ptr(),
                                                              v.data_ptr(), fwd.lse)
        assert prep.o == fwd.o and prep.dout == params.dout == grad_out.data_ptr()
        assert main[:4] == [FakeMap(t.data_ptr()).getPtr() for t in (q, k, v, grad_out)]
    assert len(cpu_op) == 1  # nothing rebuilt


@pytest.fixture
def choices(monkeypatch):
    """How often the calls plan a signature (runtime.select.Plan: the schedule resolved),
    resolve a schedule at all, and choose the kernels (a Plan's selection)."""
    from functools import cached_property

    from dashgen.runtime import select
    seen = {"plan": 0, "resolve": 0, "selection": 0}
    real_init, real_resolve = select.Plan.__init__, select.resolve_schedule
    real_selection = select.Plan.selection.func

    def count(what):
        seen[what] += 1

    def selection(self):
        count("selection")
        return real_selection(self)
    prop = cached_property(selection)
    prop.__set_name__(select.Plan, "selection")
    monkeypatch.setattr(select.Plan, "__init__",
                        lambda self, *a, **kw: count("plan") or real_init(self, *a, **kw))
    monkeypatch.setattr(select, "resolve_schedule",
                        lambda *a, **kw: count("resolve") or real_resolve(*a, **kw))
    monkeypatch.setattr(select.Plan, "selection", prop)
    return seen


def test_a_signature_is_selected_once_across_forward_and_backward(recorder, cpu_op, choices):
    """One plan per new signature: the checks resolve the schedule, the backward's launches
    take the kernels it selects; a repeated call, or the custom ops handed the resolved options,
    select nothing again."""
    q, k, v, do = leaf_inputs()
    for _ in range(2):
        out = op.attention(q, k, v, causal=True)
        torch.autograd.grad(out, (q, k, v), do)
        assert choices == {"plan": 1, "resolve": 1, "selection": 1}
    with torch.no_grad():
        o, lse = op.attention(q, k, v, causal=True, softmax_scale=0.5, return_lse=True)
    torch.ops.dashgen.attention_bwd(do, q.detach(), k.detach(), v.detach(), o, lse,
                                    *op.check_inputs(q, k, v, causal=True, softmax_scale=0.5))
    assert choices == {"plan": 1, "resolve": 1, "selection": 1}
    # A new shape: one more plan, and under no_grad no kernels chosen for a backward.
    with torch.no_grad():
        op.attention(q[:, :100], k, v, causal=True)
    assert choices == {"plan": 2, "resolve": 2, "selection": 1}


def memo_lookups(monkeypatch) -> list:
    """The memo each lookup from now on reads (Memo.__call__ and Memo.get), in order."""
    seen = []
    call, get = Memo.__call__, Memo.get
    monkeypatch.setattr(Memo, "__call__", lambda self, *a: seen.append(self) or call(self, *a))
    monkeypatch.setattr(Memo, "get",
                        lambda self, key, make: seen.append(self) or get(self, key, make))
    return seen


def spy_construction(monkeypatch, *classes) -> list:
    made = []
    for cls in classes:
        real = cls.__init__
        monkeypatch.setattr(cls, "__init__", lambda self, *a, _real=real, **kw: (
            made.append(type(self).__name__), _real(self, *a, **kw))[1])
    return made


def test_a_repeated_eager_call_looks_up_its_signature_once(recorder, cpu_op, monkeypatch):
    """One memo per call signature: a repeated call finds its Options, its plan, its prepared
    forward and the backward's prepared launches in one lookup (op._VALIDATED); the only other
    lookups are the descriptors of the addresses it is handed. It prepares nothing again but
    the backward's parameter blocks for its own tensors (a BackwardCall, as every call)."""
    q, k, v, do = leaf_inputs()
    torch.autograd.grad(op.attention(q, k, v, causal=True), (q, k, v), do)
    (entry,) = [value for value, _ in op._VALIDATED._entries.values()]
    forward_maps, bl = entry.forward.launch._maps, entry.backward
    made = spy_construction(monkeypatch, runtime_forward.ForwardCall,
                            runtime_forward.ForwardLaunch, runtime.BackwardLaunch)
    seen = memo_lookups(monkeypatch)
    recorder.launches.clear()
    torch.autograd.grad(op.attention(q, k, v, causal=True), (q, k, v), do)
    assert seen == [op._VALIDATED, forward_maps, bl._maps, bl._do_maps]
    assert made == [] and len(cpu_op) == 2
    assert len(recorder.launches) == 4  # the forward, the preprocess, the main kernel, convert
    seen.clear()
    with torch.no_grad():
        op.attention(q, k, v, causal=True)
    assert seen == [op._VALIDATED, forward_maps] and made == []


def test_a_signatures_entry_counts_the_tables_its_backward_holds(recorder, cpu_op, monkeypatch):
    """The validated entries hold their backward's launches, so they are bounded by the bytes
    of those launches' tables on the GPU (a schedule file's) as the launches' own memo is: a
    call under no_grad prepares no backward and holds none."""
    memo = op._VALIDATED
    q, k, v, do = leaf_inputs(seqlen=200)
    with torch.no_grad():
        op.attention(q, k, v, causal=True, schedule=schedule_file(200))
    assert len(memo) == 1 and memo.cache_bytes() == 0
    out = op.attention(q, k, v, causal=True, schedule=schedule_file(200))
    (entry,) = [value for value, _ in memo._entries.values()]
    one = entry.backward.device_bytes()
    assert one >= 16 * 4 and memo.cache_bytes() == one  # at least the task table
    torch.autograd.grad(out, (q, k, v), do)
    monkeypatch.setattr(memo, "max_bytes", one)
    q, k, v, do = leaf_inputs(seqlen=300)
    op.attention(q, k, v, causal=True, schedule=schedule_file(300))
    assert len(memo) == 1 and memo.cache_bytes() > one  # the 200-token signature went


def test_tensors_from_saved_tensor_hooks_get_their_own_launches(recorder, cpu_op):
    """Offloading or checkpointing hooks hand the backward other tensors than the forward's:
    the launches must read those, never the forward's addresses (freed by then)."""
    q, k, v, do = leaf_inputs()
    packed = []

    def pack(t):
        packed.append(t.detach().clone())
        return packed[-1]

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = op.attention(q, k, v, causal=True, schedule="fa3")
    recorder.launches.clear()
    torch.autograd.grad(out, (q, k, v), do)
    prep, main = main_and_prep(recorder.launches)
    sq, sk, sv, so, slse = packed
    assert len(cpu_op) == 2  # the forward's, and one for the tensors the hooks returned
    assert (main[4].q, main[4].k, main[4].v, main[4].lse, prep.o) == tuple(
        t.data_ptr() for t in (sq, sk, sv, slse, so))
    assert q.data_ptr() not in (main[4].q, prep.o)


def test_forward_descriptors_are_looked_up_once_and_follow_k_shape(recorder, monkeypatch):
    encoded = []
    monkeypatch.setattr(launch, "encode_tensor_map",
                        lambda ptr, dtype, shape, *a, **k: encoded.append((ptr, shape))
                        or FakeMap(ptr))
    clear_caches()
    q, k, v = (torch.randn(1, 200, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    for _ in range(3):
        runtime_forward.forward(q, k, v, causal=False, softmax_scale=0.1)
    assert encoded == [(t.data_ptr(), (1, 200, 4, 128)) for t in (q, k, v)]  # the first call
    # The same addresses seen with fewer keys: other descriptors, never the cached ones.
    short_k, short_v = k[:, :100], v[:, :100]
    assert (short_k.data_ptr(), short_v.data_ptr()) == (k.data_ptr(), v.data_ptr())
    runtime_forward.forward(q, short_k, short_v, causal=False, softmax_scale=0.1)
    assert encoded[3:] == [(t.data_ptr(), (1, 100, 4, 128)) for t in (k, v)]
    (_, _, args), = recorder.launches[-1:]
    assert args[:3] == [FakeMap(t.data_ptr()).getPtr() for t in (q, k, v)]
    assert (args[3].seqlen_k, args[3].k) == (100, k.data_ptr())


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_grid(recorder, causal, persistent):
    """Persistent CTAs: under a full mask as few as keep 132 SMs' busiest as busy (133 tiles:
    2 each, 67 CTAs), under a causal mask as few as deal the pairs of tiles (3 tiles of 2 heads:
    3 units; 264 units: 2 each; 133 tiles: 67 units, one each; the policy alone stops at 132
    query tiles). Without: one CTA a query tile."""
    overrides = Overrides(persistent_forward=persistent)
    for batch, seqlen, heads, full, causal_ctas in (
            (16, 1024, 32, 128, 128), (1, 300, 2, 6, 3), (3, 1000, 11, 132, 132),
            (1, 17000, 1, 67, 67)):
        q = torch.randn(batch, seqlen, heads, 64, dtype=torch.bfloat16)
        runtime_forward.forward(q, q, q, causal=causal, softmax_scale=0.1, overrides=overrides)
        name, grid, _ = recorder.launches[-1]
        tiles = -(-seqlen // 128)
        ctas = causal_ctas if causal else full
        if persistent:
            assert name.endswith("_persistent") and grid == (ctas, 1, 1)
        else:
            assert not name.endswith("_persistent") and grid == (tiles, heads, batch)


@pytest.mark.parametrize("head_dim, causal, seqlen_k, persistent", [
    (64, False, 1024, True), (64, False, 1025, False), (64, False, 16384, False),
    (128, False, 8192, True), (128, False, 8193, False), (128, False, 16384, False),
    (64, True, 1024, True), (64, True, 16384, True), (64, True, 16385, False),
    (128, True, 2048, True), (128, True, 16384, True), (128, True, 16385, False)])
def test_forward_takes_persistent_ctas_where_they_pay(recorder, head_dim, causal, seqlen_k,
                                                      persistent):
    q = torch.randn(1, 128, 2, head_dim, dtype=torch.bfloat16)
    k = torch.randn(1, seqlen_k, 2, head_dim, dtype=torch.bfloat16)
    runtime_forward.forward(q, k, k, causal=causal, softmax_scale=0.1)
    assert recorder.launches[-1][0].endswith("_persistent") == persistent


def test_forward_parameter_block_is_whole_on_every_call(recorder):
    """Copied from a per-input template: each call's block carries its own o, lse and scale."""
    q = torch.randn(2, 200, 8, 64, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 150, 2, 64, dtype=torch.bfloat16) for _ in range(2))
    outs = [runtime_forward.forward(q, k, v, causal=True, softmax_scale=scale)
            for scale in (0.5, 0.25)]
    for (o, lse), scale, (_, grid, args) in zip(outs, (0.5, 0.25), recorder.launches):
        block = args[3]
        assert (block.q, block.k, block.v, block.o, block.lse) == tuple(
            t.data_ptr() for t in (q, k, v, o, lse))
        assert (block.batch, block.heads_q, block.heads_kv, block.seqlen_q, block.seqlen_k) == (
            2, 8, 2, 200, 150)
        assert (block.q_row_stride, block.k_row_stride, block.o_row_stride) == (512, 128, 512)
        assert block.softmax_scale == scale and grid == (16, 1, 1)  # 2 tiles x 16 heads in pairs
    assert outs[0][0].data_ptr() != outs[1][0].data_ptr()


def test_a_prepared_forward_writes_each_calls_own_addresses(recorder):
    """One signature, one prepared call (runtime.forward.ForwardCall): every call's block is a
    fresh copy of its template with that call's tensors, and the template keeps none of them."""
    from dashgen.runtime.forward import forward_call
    inputs = [tuple(torch.randn(1, 256, 4, 128, dtype=torch.bfloat16) for _ in range(3))
              for _ in range(2)]
    outs = [runtime_forward.forward(*t, causal=False, softmax_scale=0.125) for t in inputs]
    assert len(recorder.launches) == 2
    for (q, k, v), (o, lse), (_, _, args) in zip(inputs, outs, recorder.launches):
        block = args[3]
        assert (block.q, block.k, block.v, block.o, block.lse) == tuple(
            t.data_ptr() for t in (q, k, v, o, lse))
        assert args[:3] == [FakeMap(t.data_ptr()).getPtr() for t in (q, k, v)]
    q = inputs[0][0]
    call = forward_call(q.shape, q.shape, q.dtype, False, 0.125, q.device, Overrides())
    assert (call.template.q, call.template.o, call.template.lse) == (None, None, None)
    assert (call.template.seqlen_q, call.template.softmax_scale) == (256, 0.125)


def test_the_prepared_backward_keeps_no_tensor_alive(recorder, cpu_op):
    """The call rides on the autograd node and holds addresses only: no reference cycle keeps a
    forward's output (or anything saved with it) alive once the graph is dropped."""
    import weakref
    q, k, v, _ = leaf_inputs()
    out = op.attention(q, k, v, causal=True, schedule="fa3")
    assert len(cpu_op) == 1
    gone = weakref.ref(out)
    del out
    assert gone() is None  # freed by reference counting, without the cycle collector


@pytest.mark.parametrize("heads_kv", [4, 2], ids=["mha", "gqa"])
def test_a_packs_small_kernels_walk_its_tiles_through_the_plans_maps(recorder, heads_kv):
    """The packed preprocess and converts: grids over a head's packed tiles (PackedTile: total
    / block + batch tiles of kRowsPerBlock-row CTAs), not batch times the longest sequence,
    each reading the tile map the plan kernel writes after its orders."""
    lengths = [300, 0, 5, 129, 1]
    batch, total, heads_q, head_dim = len(lengths), sum(lengths), 4, 128
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    q, do, o = (torch.randn(total, heads_q, head_dim, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(total, heads_kv, head_dim, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(heads_q * total)
    varlen.backward(do, q, k, v, o, lse, cu, cu, max(lengths), max(lengths), causal=True,
                    softmax_scale=0.1, deterministic=True, schedule="auto", workers=8)
    gqa = heads_kv != heads_q
    kinds = [name.rsplit("_", 1)[-1] for name, _, _ in recorder.launches]
    assert kinds == ["plan", "preprocess", "varlen", "convert"] + ["convert"] * 2 * gqa
    (_, _, (plan,)), (_, prep_grid, (prep,)), _, (_, q_grid, (convert_q,)) = (
        recorder.launches[:4])
    bm, bn = 64, 128  # head_dim 128's tiles
    layout = varlen.PackWorkspace(batch, total, total, heads_q, heads_kv, head_dim, bm, bn,
                                  gqa)
    assert (layout.q_tiles, layout.k_tiles) == (varlen.pack_tiles(total, batch, bm),
                                                varlen.pack_tiles(total, batch, bn))
    map_q = plan.pack_plan + 4 * layout.map_words
    assert prep.tile_seq == convert_q.tile_seq == map_q
    assert prep_grid == q_grid == (layout.q_tiles * bm // 16, heads_q, 1)
    assert (prep.cu_seqlens, convert_q.cu_seqlens) == (cu.data_ptr(), cu.data_ptr())
    for _, grid, (convert_kv,) in recorder.launches[4:]:
        assert convert_kv.tile_seq == map_q + 4 * layout.q_tiles
        assert convert_kv.block_m == bn
        assert grid == (layout.k_tiles * bn // 16, heads_kv, 1)


def test_packs_of_other_longest_lengths_share_their_launches(recorder):
    """A pack's launches and descriptors are fixed by its sizes but the longest lengths
    (PackBackwardLaunch, and the forward's per grid): packs that differ only there share them,
    and each call's blocks and forward grid carry its own lengths."""
    lengths = [300, 0, 5, 129, 1]
    total = sum(lengths)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    q, do, o = (torch.randn(total, 4, 128, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(total, 2, 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(4 * total)
    calls = []
    for longest in (300, 400):
        recorder.launches.clear()
        varlen.forward(q, k, v, cu, cu, longest, longest, causal=True, softmax_scale=0.1)
        varlen.backward(do, q, k, v, o, lse, cu, cu, longest, longest, causal=True,
                        softmax_scale=0.1, deterministic=True, schedule="auto", workers=8)
        calls.append(list(recorder.launches))
    assert len(varlen.pack_backward_launch) == 1 and len(varlen.pack_backward_call) == 2
    for longest, launches in zip((300, 400), calls):
        (_, grid, fwd_args), (_, _, (plan,)), (_, _, (prep,)), (_, _, main_args), *converts = (
            launches)
        assert grid == (-(-longest // 128), 4, 5) and fwd_args[3].seqlen_q == longest
        params = main_args[4]
        assert (params.seqlen_q, params.seqlen_k, plan.seqlen_q) == (longest,) * 3
        assert params.num_m_blocks == -(-longest // 64)
        assert params.num_n_blocks == -(-longest // 128)
        assert prep.seqlen == longest and all(c[0].seqlen == longest for _, _, c in converts)
        assert main_args[:4] == calls[0][3][2][:4]  # the same descriptors


def test_a_packs_eager_call_launches_what_its_custom_ops_launch(recorder, cpu_op, monkeypatch):
    """attention_varlen's autograd node runs the calls prepared for its signature from the
    selection its checks made (no selection looked up per call); the custom ops, given only the
    options, look it up and launch the same kernels with the same blocks, called directly or
    through their autograd."""
    from dashgen.runtime import op_varlen
    looked_up = []
    real = varlen.pack_selection
    monkeypatch.setattr(varlen, "pack_selection",
                        lambda *a: looked_up.append(a) or real(*a))
    lengths = [300, 0, 5, 129, 1]
    total, longest = sum(lengths), max(lengths)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    torch.manual_seed(0)
    q = torch.randn(total, 4, 128, dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn(total, 2, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    do = torch.randn(total, 4, 128, dtype=torch.bfloat16)
    for _ in range(2):
        recorder.launches.clear()
        out = op_varlen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
        eager = torch.autograd.grad(out, (q, k, v), do)
    assert looked_up == []
    kinds = [name.rsplit("_", 1)[-1] for name, _, _ in recorder.launches]
    assert kinds == ["varlen", "plan", "preprocess", "varlen", "convert", "convert", "convert"]
    launched = _without_addresses(recorder.launches)
    recorder.launches.clear()
    opts = op_varlen.check_varlen_inputs(q, k, v, cu, cu, longest, longest, causal=True)
    o, lse = torch.ops.dashgen.attention_varlen_fwd(q.detach(), k.detach(), v.detach(), cu, cu,
                                                    longest, longest, *opts)
    grads = torch.ops.dashgen.attention_varlen_bwd(do, q.detach(), k.detach(), v.detach(), o,
                                                   lse, cu, cu, longest, longest, *opts)
    assert len(looked_up) == 2  # the forward's and the backward's
    assert _without_addresses(recorder.launches) == launched
    assert [g.shape for g in grads] == [g.shape for g in eager]
    # Through the custom op's autograd (what torch.compile runs): the same backward launches.
    o, lse = torch.ops.dashgen.attention_varlen_fwd(q, k, v, cu, cu, longest, longest, *opts)
    recorder.launches.clear()
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert _without_addresses(recorder.launches) == launched[1:]
    assert [g.shape for g in grads] == [g.shape for g in eager] and not lse.requires_grad


def test_a_repeated_packed_call_looks_up_its_signature_once(recorder, cpu_op, monkeypatch):
    """One memo per call signature for packs too: a repeated call finds its Options, its
    selection and its prepared forward and backward (runtime.varlen.PackForwardCall,
    PackBackwardCall with its PackBackwardLaunch) in one lookup (op_varlen._VALIDATED); the only
    other lookups are the descriptors of the addresses it is handed, and nothing is prepared
    again."""
    from dashgen.runtime import op_varlen
    lengths = [300, 0, 5, 129, 1]
    total, longest = sum(lengths), max(lengths)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    q = torch.randn(total, 4, 128, dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn(total, 2, 128, dtype=torch.bfloat16).requires_grad_() for _ in range(2))
    do = torch.randn(total, 4, 128, dtype=torch.bfloat16)

    def call():
        out = op_varlen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
        return torch.autograd.grad(out, (q, k, v), do)
    call()
    (entry,) = [value for value, _ in op_varlen._VALIDATED._entries.values()]
    forward, backward = entry.forward, entry.backward
    made = spy_construction(monkeypatch, varlen.PackForwardCall, varlen.PackBackwardCall,
                            runtime_forward.ForwardLaunch, varlen.PackBackwardLaunch,
                            varlen.PackWorkspace)
    seen = memo_lookups(monkeypatch)
    recorder.launches.clear()
    call()
    assert seen == [op_varlen._VALIDATED, forward.launch._maps, backward.bl._maps,
                    backward.bl._do_maps]
    assert made == [] and len(recorder.launches) == 7  # forward; plan, prep, main, 3 converts
    seen.clear()
    with torch.no_grad():
        op_varlen.attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)
    assert seen == [op_varlen._VALIDATED, forward.launch._maps] and made == []


def test_one_packer_makes_every_launchs_argument_array():
    """launch.addresses: an int is an address already, a ctypes object gives its own;
    pack_args holds plain values (a device pointer, a scalar) and packs their holders with it."""
    block = PrepParams(batch=3)
    scalar = ctypes.c_int32(7)
    packed = launch.addresses(0x7000_0010, block, scalar)
    assert list(packed) == [0x7000_0010, ctypes.addressof(block), ctypes.addressof(scalar)]
    pointers, keep = launch.pack_args([0x1000, scalar, block])
    assert ctypes.c_uint64.from_address(pointers[0]).value == 0x1000
    assert list(pointers)[1:] == [ctypes.addressof(scalar), ctypes.addressof(block)]
    assert keep[1:] == [scalar, block]
    assert len(launch.pack_args([])[0]) == 1
    with pytest.raises(TypeError, match=r"^kernel argument 0 has type float"):
        launch.pack_args([1.5])


def test_a_launchers_grid_and_block_are_one_to_three_positive_ints():
    assert launch._dim3(5, "grid") == (5, 1, 1)
    assert launch._dim3([3, 4], "block") == (3, 4, 1)
    assert launch._dim3((3.0, 2, 7), "grid") == (3, 2, 7)
    for bad in ((), (1, 2, 3, 4), (0,), (3, -1), 0):
        with pytest.raises(ValueError, match=r"^grid must be 1 to 3 positive ints, got "):
            launch._dim3(bad, "grid")
