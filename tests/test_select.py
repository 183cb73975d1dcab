"""dashgen.runtime.select, the one place that chooses: what it picks on the benchmark's 20
configurations (the table in tests/benchmark_picks.py), how Overrides replace each policy,
errors that name the argument, and the plan a call signature gets (made once, found again under
the options it resolves to)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dashgen import Mask, Problem
from dashgen.codegen.variants import (DQ_WRITERS_KERNEL_HEAD_DIMS, BackwardVariant,
                                     ForwardVariant, backward_tiles, kernel_head_dim)
from dashgen.runtime.select import (AUTO_SCHEDULES, DEFAULT_SM_COUNT, DQ_LAST_FROM_KV_TILES,
                                    DQ_WRITERS_FROM_KV_TILES,
                                    Overrides, Plan,
                                    check_kernel_problem, early_kv_pays,
                                    forward_persistent_pays, problem_for, resolve_schedule,
                                    plan, select, select_forward, balanced_workers, fuses_convert,
                                    mask_of)
from dashgen.schedule.builders import BUILDERS, Tiling, build_schedule

from benchmark_picks import BENCHMARK_PICKS, TWO_WRITERS, picked_variants


def benchmark_problem(head_dim: int, causal: bool, seqlen: int) -> Problem:
    heads = 2048 // head_dim
    return problem_for(16384 // seqlen, heads, heads, seqlen, seqlen, head_dim, causal)


@pytest.fixture(scope="module")
def picks():
    """Both modes' selections of every benchmark configuration (built once for the module)."""
    return {key: (select(benchmark_problem(*key), "bf16"),
                  select(benchmark_problem(*key), "bf16", deterministic=False))
            for key in BENCHMARK_PICKS}


@pytest.mark.parametrize("key", list(BENCHMARK_PICKS),
                         ids=lambda k: f"d{k[0]}-{'causal' if k[1] else 'full'}-{k[2]}")
def test_the_benchmark_configurations_get_their_kernels(picks, key):
    head_dim, causal, seqlen = key
    schedule, workers, fused, early, persistent = BENCHMARK_PICKS[key]
    det, nondet = picks[key]
    assert det.problem == benchmark_problem(*key)
    assert (det.schedule, det.num_workers) == (schedule, workers)
    assert det.backward == BackwardVariant("bf16", head_dim, causal, schedule, deterministic=True,
                                           fused_convert=fused, early_kv=early,
                                           dq_writers=2 if key in TWO_WRITERS else 1)
    assert det.forward == ForwardVariant("bf16", head_dim, causal, persistent=persistent)
    assert (det.forward, det.backward, nondet.backward) == picked_variants(key)
    # Without the order nothing can tell when a dQ sum is final: where dQ is converted in the
    # kernel, deterministic=False runs the ordered kernel (`unordered-unfused`).
    assert (nondet.schedule, nondet.num_workers, nondet.forward) == (schedule, workers,
                                                                     det.forward)
    expected = det.backward if fused else BackwardVariant(
        "bf16", head_dim, causal, schedule, deterministic=False, early_kv=early)
    assert nondet.backward == expected


def test_the_policies_agree_with_the_table():
    for (head_dim, causal, seqlen), (_, _, _, early, persistent) in BENCHMARK_PICKS.items():
        problem = benchmark_problem(head_dim, causal, seqlen)
        assert early_kv_pays(problem) is early
        assert forward_persistent_pays(seqlen, head_dim, causal) is persistent


def test_problem_for_is_in_the_backwards_tiles_and_memoized():
    p64 = problem_for(2, 8, 2, 300, 200, 64, True)
    p128 = problem_for(2, 8, 2, 300, 200, 128, False)
    assert (p64.block_m, p64.block_n, p64.mask) == (128, 128, Mask.causal())
    assert (p128.block_m, p128.block_n, p128.mask) == (64, 128, Mask.full())
    assert (p64.batch, p64.heads_q, p64.heads_kv, p64.seqlen_q, p64.seqlen_k) == (2, 8, 2, 300,
                                                                                 200)
    assert problem_for(2, 8, 2, 300, 200, 64, True) is p64


# -- Overrides -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", [True, False])
def test_fused_convert_override_replaces_the_policy(value):
    # 16k tokens at 1k (fused) and 16k (not fused): the override wins either way, without a plan.
    for seqlen in (1024, 16384):
        problem = benchmark_problem(128, False, seqlen)
        sel = select(problem, "bf16", overrides=Overrides(fused_convert=value))
        assert sel.backward.fused_convert is value
        nondet = select(problem, "bf16", deterministic=False,
                        overrides=Overrides(fused_convert=value))
        # Converting dQ in the kernel needs the order: deterministic=False then runs it.
        assert nondet.backward.fused_convert is value
        assert nondet.backward.deterministic is value


def test_fused_convert_policy_reads_the_longest_worker():
    """At 1k tokens the convert kernel costs more than the converter's share; at 16k not."""
    problem = benchmark_problem(128, False, 1024)
    assert select(problem, "bf16").backward.fused_convert
    assert fuses_convert(problem, 1) and not fuses_convert(problem, 10**9)


@pytest.mark.parametrize("value", [True, False])
def test_early_kv_override_replaces_the_policy(value):
    for seqlen in (1024, 16384):  # the policy's on at 1k causal, off at 16k
        problem = benchmark_problem(128, True, seqlen)
        for deterministic in (True, False):
            sel = select(problem, "bf16", deterministic=deterministic,
                         overrides=Overrides(early_kv=value, fused_convert=False))
            assert sel.backward.early_kv is value


@pytest.mark.parametrize("head_dim", [64, 128])
def test_dq_last_runs_the_ordered_long_causal_sequences(head_dim):
    long = DQ_LAST_FROM_KV_TILES[head_dim] * 128  # keys: that many KV tiles of 128
    for seqlen, causal, deterministic, expected in (
            (long, True, True, True), (long - 128, True, True, False),
            (long, True, False, False),  # the unordered kernel keeps its order
            (long, False, True, False),  # full masks keep it too
            (16384, True, True, False)):
        problem = problem_for(1, 2048 // head_dim, 2048 // head_dim, seqlen, seqlen, head_dim,
                              causal)
        sel = select(problem, "bf16", deterministic=deterministic)
        assert sel.backward.dq_last is expected, (head_dim, seqlen, causal, deterministic)
    # head_dim 64 starts later: at 64k tokens its dq_last measured 0.92x.
    assert DQ_LAST_FROM_KV_TILES[64] > DQ_LAST_FROM_KV_TILES[128]


@pytest.mark.parametrize("value", [True, False])
def test_dq_last_override_replaces_the_policy(value):
    for seqlen in (1024, DQ_LAST_FROM_KV_TILES[128] * 128):
        sel = select(benchmark_problem(128, True, min(seqlen, 16384)) if seqlen <= 16384 else
                     problem_for(1, 16, 16, seqlen, seqlen, 128, True), "bf16",
                     overrides=Overrides(dq_last=value))
        assert sel.backward.dq_last is value


@pytest.mark.parametrize("head_dim", [64, 96, 128, 192])
def test_two_dq_writers_where_the_rows_are_long(head_dim):
    """The ordered backward of head_dim 128's kernel (96 runs in it) takes two dQ writers from
    DQ_WRITERS_FROM_KV_TILES KV tiles on, the converter left to the convert kernel (its warps
    are the second writer's); shorter rows, the unordered kernel, windows and the other kernels
    keep one. Overrides replace the pick either way."""
    bound = DQ_WRITERS_FROM_KV_TILES.get(kernel_head_dim(head_dim))
    for seqlen in (1024, 8192, 16384, DQ_LAST_FROM_KV_TILES[128] * 128):
        problem = (benchmark_problem(head_dim, True, seqlen) if seqlen <= 16384 else
                   problem_for(1, 16, 16, seqlen, seqlen, head_dim, True))
        long = bound is not None and problem.num_n_blocks >= bound
        sel = select(problem, "bf16")
        assert sel.backward.dq_writers == (2 if long else 1)
        assert select(problem, "bf16", deterministic=False).backward.dq_writers == 1
        if long:
            assert not sel.backward.fused_convert
            one = select(problem, "bf16", overrides=Overrides(dq_writers=1))
            assert one.backward.dq_writers == 1 and one.backward.dq_last == sel.backward.dq_last
            # An explicit converter takes its warps back: one writer, no refusal.
            fused = select(problem, "bf16", overrides=Overrides(fused_convert=True))
            assert fused.backward.dq_writers == 1 and fused.backward.fused_convert
            window = Problem(seqlen_q=seqlen, heads_q=16, head_dim=head_dim,
                             mask=Mask.window(1023, 0), block_m=64, block_n=128)
            assert select(window, "bf16").backward.dq_writers == 1
            # Under a soft cap (not yet timed with two writers) one writer, still without
            # the converter; asked for explicitly, two.
            capped = sel.soft_capped(True).backward
            assert capped.softcap and capped.dq_writers == 1 and not capped.fused_convert
            two = Overrides(dq_writers=2)
            assert select(problem, "bf16", overrides=two).soft_capped(
                True, two_writers_asked=True).backward.dq_writers == 2
    if kernel_head_dim(head_dim) not in DQ_WRITERS_KERNEL_HEAD_DIMS:
        with pytest.raises(ValueError, match="dq_writers=2 needs"):
            select(benchmark_problem(head_dim, True, 1024), "bf16",
                   overrides=Overrides(dq_writers=2))
    else:  # no policy at 64 yet: asked for, two
        sel = select(benchmark_problem(head_dim, True, 1024), "bf16",
                     overrides=Overrides(dq_writers=2))
        assert sel.backward.dq_writers == 2 and not sel.backward.fused_convert
        with pytest.raises(ValueError, match="dq_writers=2 needs"):
            select(benchmark_problem(head_dim, True, 1024), "bf16",
                   overrides=Overrides(dq_writers=2, fused_convert=True))


@pytest.mark.parametrize("value", [True, False])
def test_persistent_forward_override_replaces_the_policy(value):
    for head_dim, causal, seqlen in ((128, False, 1024), (128, False, 16384), (64, True, 1024),
                                     (64, True, 16384)):
        problem = benchmark_problem(head_dim, causal, seqlen)
        forward = select_forward(problem, "bf16", overrides=Overrides(persistent_forward=value))
        assert forward == ForwardVariant("bf16", head_dim, causal, persistent=value)
        sel = select(problem, "fp16", deterministic=False,
                     overrides=Overrides(persistent_forward=value))
        assert sel.forward == ForwardVariant("fp16", head_dim, causal, persistent=value)


def test_the_causal_persistent_forward_policy_stops_at_the_sm_count_tiles_a_head():
    """It was measured up to the SM count's query tiles a head: past it (here 134 query tiles of
    128 rows on 132 SMs) the policy picks the one-CTA-a-tile forward; the override still runs
    the persistent one (its order serves any length)."""
    problem = problem_for(1, 2, 2, 134 * 128, 128, 128, True)
    assert not select_forward(problem, "bf16").persistent
    assert select_forward(problem, "bf16", sm_count=134).persistent
    on = Overrides(persistent_forward=True)
    assert select_forward(problem, "bf16", overrides=on).persistent


# -- schedules and workers -----------------------------------------------------------------------

def test_auto_takes_the_first_candidate_that_serves_on_balanced_workers():
    for kind, candidates in AUTO_SCHEDULES.items():
        if kind == "window":
            continue  # no DASH order serves a band: test_a_window_runs_the_window_kernels
        problem = Problem(batch=2, heads_q=4, seqlen_q=1000, mask=kind, block_m=64, block_n=128)
        per_seq = BUILDERS[candidates[0]].units(Tiling(problem))
        for sms in (114, 132):
            name, workers = resolve_schedule(problem, "auto", None, sms)
            assert name == candidates[0]
            used = BUILDERS[name].workers_used(problem, sms)
            assert workers == balanced_workers(problem, per_seq, used) <= sms
            assert workers % per_seq == 0 or workers == problem.batch * problem.heads_q * per_seq
        assert BUILDERS[candidates[0]].heads_together  # a DASH order first
        assert not BUILDERS[candidates[-1]].heads_together  # a fallback live on any count


def test_auto_falls_back_where_a_sequence_does_not_fit_the_sms():
    """One 64k-token causal sequence has 256 symmetric_shift units: more than 132 workers."""
    long = problem_for(1, 16, 16, 65536, 65536, 128, True)
    assert resolve_schedule(long, "auto", None, 132) == ("spt_listed", 132)
    # deterministic=False promises no bits: the unordered kernel keeps spt's deal there
    assert resolve_schedule(long, "auto", None, 132, deterministic=False) == ("spt", 132)
    assert select(long, "bf16", deterministic=False).schedule == "spt"
    full = problem_for(1, 16, 16, 32768, 32768, 128, False)
    assert resolve_schedule(full, "auto", None, 132) == ("fa3", 132)
    with pytest.raises(ValueError, match=r"symmetric_shift.*at least 256 workers.*num_workers=132"):
        resolve_schedule(long, "symmetric_shift", None, 132)


def test_auto_passes_over_a_dash_order_that_leaves_the_workers_idle():
    """head_dim 192 (64x96 tiles), causal: at 16k a sequence has 171 KV tiles, so
    symmetric_shift's 86 units hold one sequence a wave, 86 of 132 workers: auto takes the
    listed spt on all of them. At 8k its 43 units fill 129 of 132 and it stays."""
    long = problem_for(1, 10, 10, 16384, 16384, 192, True)
    assert BUILDERS["symmetric_shift"].workers_used(long, 132) == 86
    assert resolve_schedule(long, "auto", None, 132) == ("spt_listed", 132)
    assert resolve_schedule(long, "auto", None, 132, deterministic=False) == ("spt", 132)
    # Asked by name it runs, on its 86.
    assert resolve_schedule(long, "symmetric_shift", None, 132) == ("symmetric_shift", 86)
    half = problem_for(2, 10, 10, 8192, 8192, 192, True)
    assert resolve_schedule(half, "auto", None, 132)[0] == "symmetric_shift"
    # Fewer units than workers fill what they can: the rule counts against the units.
    small = problem_for(1, 2, 2, 1000, 1000, 192, True)
    assert resolve_schedule(small, "auto", None, 132)[0] == "symmetric_shift"


def test_auto_takes_fa3_where_one_d64_full_head_fills_a_wave():
    """Head_dim 64, full mask: past half the workers' KV tiles a sequence (shift would run one
    head a wave) fa3 on every worker; head_dim 128 and causal masks keep the DASH orders."""
    for sms in (114, 132):
        edge = sms // 2 * 128  # tokens of exactly half the workers' KV tiles
        for seqlen, expect in ((edge, "shift"), (edge + 1, "fa3"), (16384, "fa3")):
            problem = problem_for(1, 32, 32, seqlen, seqlen, 64, False)
            name, workers = resolve_schedule(problem, "auto", None, sms)
            assert name == expect, seqlen
            if name == "fa3":
                assert workers == sms  # every worker, not shift's balanced count
        # sms - 8 KV tiles: one head a wave on all but 8 workers (auto-worker-use keeps it)
        seqlen = (sms - 8) * 128
        wide = problem_for(1, 16, 16, seqlen, seqlen, 128, False)
        assert resolve_schedule(wide, "auto", None, sms)[0] == "shift"
        causal = problem_for(1, 32, 32, seqlen, seqlen, 64, True)
        assert resolve_schedule(causal, "auto", None, sms)[0] == "symmetric_shift"


@pytest.mark.parametrize("name", ["fa3", "spt", "descending"])
def test_worker_independent_schedules_default_to_the_sm_count(name):
    # Never more workers than units: 2 heads of 3 KV tiles give 6.
    problem = problem_for(1, 2, 2, 300, 300, 128, True)
    assert resolve_schedule(problem, name, None, 114) == (name, 6)
    assert resolve_schedule(problem, name, 5, 114) == (name, 5)
    big = problem_for(4, 16, 16, 2048, 2048, 128, True)
    assert resolve_schedule(big, name, None, 114) == (name, 114)
    sel = select(big, "bf16", schedule=name, sm_count=114,
                 overrides=Overrides(fused_convert=False))
    assert (sel.schedule, sel.num_workers) == (name, 114)


def test_trace_and_gqa_reach_the_backward_variant():
    problem = problem_for(1, 8, 2, 300, 300, 64, False)
    sel = select(problem, "fp16", trace=True, schedule="fa3", num_workers=5,
                 overrides=Overrides(fused_convert=False))
    assert sel.backward == BackwardVariant("fp16", 64, False, "fa3", gqa=True, trace=True,
                                           early_kv=early_kv_pays(problem))
    assert sel.backward.kernel_name.endswith("_gqa_ekv_trace")
    assert (sel.schedule, sel.num_workers) == ("fa3", 5)


def test_the_default_sm_count_is_an_h200s():
    assert DEFAULT_SM_COUNT == 132
    problem = problem_for(4, 16, 16, 2048, 2048, 128, False)
    assert select(problem, "bf16", schedule="fa3",
                  overrides=Overrides(fused_convert=False)).num_workers == 132


# -- errors --------------------------------------------------------------------------------------

FULL = problem_for(1, 2, 2, 1000, 1000, 128, False)
CAUSAL = problem_for(1, 2, 2, 1000, 1000, 128, True)


@pytest.mark.parametrize("problem, kwargs, pattern", [
    (FULL, dict(num_workers=133), r"^num_workers=133 exceeds this GPU's 132 SMs"),
    (FULL, dict(schedule="fa3", num_workers=9, sm_count=8), r"^num_workers=9 exceeds this GPU's 8"),
    (FULL, dict(schedule="shift", num_workers=7),
     r"^num_workers: schedule 'shift' needs at least 8 workers .*num_workers=7"),
    (CAUSAL, dict(schedule="symmetric_shift", num_workers=3),
     r"^num_workers: schedule 'symmetric_shift' needs at least 4 workers .*num_workers=3"),
    (CAUSAL, dict(schedule="shift", num_workers=7), r"^schedule='shift' cannot serve this "
                                                    r"problem: shift needs a full mask"),
    (FULL, dict(schedule="symmetric_shift", num_workers=7),
     r"^schedule='symmetric_shift' cannot serve this problem: .*causal"),
    (FULL, dict(schedule="fastest"), r"^unknown schedule 'fastest'; known: fa3, spt"),
])
def test_schedule_errors_name_the_argument(problem, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        select(problem, "bf16", **kwargs)


@pytest.mark.parametrize("dtype", ["fp32", "bfloat16", ""])
def test_an_unsupported_dtype_is_named(dtype):
    with pytest.raises(ValueError, match=rf"^dtype must be one of \['bf16', 'fp16'\], got "
                                         rf"{dtype!r}"):
        select(FULL, dtype)


@pytest.mark.parametrize("head_dim", [16, 72, 160, 320])
def test_an_unsupported_head_dim_is_named(head_dim):
    problem = Problem(seqlen_q=256, head_dim=head_dim, block_m=64, block_n=128)
    with pytest.raises(ValueError, match=rf"^head_dim must be one of \(32, 48, 64, 80, 96, 112, "
                                         rf"128, 192, 256\), got {head_dim}"):
        select(problem, "bf16")


@pytest.mark.parametrize("head_dim, block_m, block_n, pattern", [
    (128, 128, 128, r"^block_m must be 64, the backward's tile at head_dim 128 \(64x128\), "
                    r"got 128"),
    (64, 64, 128, r"^block_m must be 128, the backward's tile at head_dim 64 \(128x128\), got 64"),
    (128, 64, 64, r"^block_n must be 128, the backward's tile at head_dim 128 \(64x128\), got 64"),
])
def test_tiles_other_than_the_backwards_are_refused(head_dim, block_m, block_n, pattern):
    problem = Problem(seqlen_q=256, head_dim=head_dim, block_m=block_m, block_n=block_n)
    with pytest.raises(ValueError, match=pattern):
        check_kernel_problem(problem)
    with pytest.raises(ValueError, match=pattern):
        select(problem, "bf16")


def test_a_window_runs_the_window_kernels():
    """A sliding window: its own kernels (bounds as parameters) under the launch-ordered
    schedules, spt on the listed deal by default (spt unordered), the dQ converted in the main
    kernel where that pays as for the other masks, the one-tile forward; the shift orders
    refused."""
    problem = Problem(seqlen_q=2048, heads_q=4, mask=Mask.window(255, 0), block_m=64,
                      block_n=128)
    sel = select(problem, "bf16")
    assert sel.schedule == "spt_listed" and sel.backward.window and not sel.backward.causal
    assert sel.forward.window and not sel.forward.persistent
    assert sel.backward.kernel_name.startswith("dashgen_bwd_bf16_d128_window_sptl_det")
    assert select(problem, "bf16", deterministic=False).schedule == "spt"
    assert select(problem, "bf16", schedule="fa3").backward.window
    with pytest.raises(ValueError, match=r"^schedule='shift' cannot serve this problem"):
        select(problem, "bf16", schedule="shift")
    for fused in (True, False):
        assert select(problem, "bf16", overrides=Overrides(fused_convert=fused)
                      ).backward.fused_convert is fused


def test_a_window_converts_dq_in_the_main_kernel_where_that_pays():
    """The deterministic windowed backward takes the fused converter by the masks' rule
    (`fuses_convert`): at 16,384 tokens of 16 heads it pays at 128 and 1,024 keys, not at
    4,096. deterministic=False keeps the unordered kernel and the convert kernel."""
    def picked(left, deterministic=True):
        problem = Problem(seqlen_q=16384, heads_q=16, mask=Mask.window(left, 0), block_m=64,
                          block_n=128)
        return select(problem, "bf16", deterministic=deterministic).backward
    assert picked(127).fused_convert and picked(1023).fused_convert
    assert picked(1023).kernel_name == "dashgen_bwd_bf16_d128_window_sptl_det_fconv"
    assert not picked(4095).fused_convert
    unordered = picked(1023, deterministic=False)
    assert not unordered.fused_convert and not unordered.deterministic
    assert mask_of(False, (100, -1)) == Mask.window(100, None)
    assert mask_of(True) == Mask.causal() and mask_of(False) == Mask.full()


def test_fused_convert_without_the_order_is_refused_by_the_variant():
    with pytest.raises(ValueError, match=r"^fused_convert needs deterministic=True"):
        BackwardVariant("bf16", 128, False, "fa3", deterministic=False, fused_convert=True)


def test_a_schedule_file_gets_one_key_and_is_digested_once(monkeypatch):
    """The op carries a schedule file as a key; the same object passed again is not digested
    again (its digest reads every task), and an equal schedule gets the same key."""
    from dashgen import Schedule
    from dashgen.runtime.tables import register, table_of
    problem = problem_for(1, 2, 2, 512, 512, 128, True)
    first = build_schedule("fa3", problem, 3)
    key = register(first)
    assert key.startswith("table:") and table_of(key) is first
    twin = build_schedule("fa3", problem, 3)
    assert register(twin) == key and table_of(key) is first
    monkeypatch.setattr(Schedule, "to_json", lambda self: pytest.fail("digested again"))
    assert register(first) == key


# -- a call signature's plan -----------------------------------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 4), heads_kv=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2]),
       seqlen_q=st.integers(1, 5000), seqlen_k=st.integers(1, 5000),
       head_dim=st.sampled_from([64, 128]), causal=st.booleans(), deterministic=st.booleans(),
       schedule=st.sampled_from(["auto", *BUILDERS]),
       num_workers=st.one_of(st.none(), st.integers(1, 132)))
def test_the_options_a_plan_resolves_to_plan_the_same(batch, heads_kv, group, seqlen_q, seqlen_k,
                                                      head_dim, causal, deterministic, schedule,
                                                      num_workers):
    """A plan is filed under the schedule and workers it resolves to as well: planned from
    those, the same problem gets the same schedule, workers and kernels."""
    problem = problem_for(batch, heads_kv * group, heads_kv, seqlen_q, seqlen_k, head_dim, causal)
    options = dict(deterministic=deterministic, sm_count=132)
    try:
        first = Plan(problem, "bf16", schedule=schedule, num_workers=num_workers, **options)
    except ValueError:
        return  # refused by name; nothing is filed
    again = Plan(problem, "bf16", schedule=first.schedule, num_workers=first.num_workers,
                 **options)
    assert (again.schedule, again.num_workers) == (first.schedule, first.num_workers)
    assert again.selection == first.selection
    assert first.selection == select(problem, "bf16", schedule=schedule, num_workers=num_workers,
                                     **options)


def test_a_signature_is_planned_once_and_found_under_its_resolved_options(monkeypatch):
    made = []
    real = Plan.__init__
    monkeypatch.setattr(Plan, "__init__", lambda self, *a, **kw: made.append(1) or real(
        self, *a, **kw))
    plan.cache_clear()
    shapes = ((2, 1024, 16, 128), (2, 1024, 16, 128))
    signature = ("bf16", True, True, False)
    first = plan(*shapes, *signature, "auto", None, 132, Overrides())
    assert (first.schedule, first.num_workers) == ("symmetric_shift", 128)
    assert plan(*shapes, *signature, "auto", None, 132, Overrides()) is first
    assert plan(*shapes, *signature, "symmetric_shift", 128, 132, Overrides()) is first
    assert len(made) == 1
    # Other options, another plan; the selection is made on first use, once.
    other = plan(*shapes, *signature, "fa3", None, 132, Overrides())
    assert other is not first and len(made) == 2
    assert other.selection is other.selection and other.selection.schedule == "fa3"
    # A schedule file's key resolves to itself on the file's workers.
    from dashgen.runtime.tables import register
    problem = problem_for(1, 4, 4, 512, 512, 128, True)
    key = register(build_schedule("fa3", problem, 3))
    shapes = ((1, 512, 4, 128), (1, 512, 4, 128))
    table = plan(*shapes, *signature, key, None, 132, Overrides())
    assert (table.schedule, table.schedule_key, table.num_workers) == ("table", key, 3)
    assert plan(*shapes, *signature, key, 3, 132, Overrides()) is table
    assert table.selection.table == key and len(made) == 3
    plan.cache_clear()


def test_head_dim_96_selects_the_128_kernels_policies():
    """96 runs in the 128 kernels (KERNEL_HEAD_DIMS): the same tiles, and the per-head_dim
    policies read at 128 (dq_last from 512 KV tiles under a causal mask)."""
    long = Problem(seqlen_q=65536, head_dim=96, mask=Mask.causal(), block_m=64, block_n=128)
    picked = select(long, "bf16")
    assert picked.backward.dq_last and picked.backward.kernel_head_dim == 128
    assert picked.backward.kernel_name.startswith("dashgen_bwd_bf16_d96_causal_")
    assert picked.forward.head_dim == 96 and picked.forward.kernel_head_dim == 128


@pytest.mark.parametrize("head_dim", [192, 256])
def test_fused_convert_asked_of_the_swapped_mainloop_is_refused_by_name(head_dim):
    """Its dQ is converted by the convert kernel: an explicit fused_convert=True is refused,
    not dropped; the policy's choice there is False."""
    problem = Problem(seqlen_q=1024, heads_q=4, head_dim=head_dim, block_m=64,
                      block_n=backward_tiles(head_dim)[1])
    with pytest.raises(ValueError, match=rf"^fused_convert: head_dim {head_dim} runs the swapped"):
        select(problem, "bf16", overrides=Overrides(fused_convert=True))
    assert not select(problem, "bf16").backward.fused_convert
    assert not select(problem, "bf16", overrides=Overrides(fused_convert=False)
                      ).backward.fused_convert
