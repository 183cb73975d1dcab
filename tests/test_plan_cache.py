"""The disk cache of verified, lowered plans: hits return the same table, anything doubtful
rebuilds, and a cache folder that cannot be written never fails a call."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dashgen import Mask, Problem, build_schedule, plan_cache, runtime, verify  # noqa: E402
from dashgen.lower import lower  # noqa: E402

PROBLEM = Problem(batch=2, heads_q=4, heads_kv=2, seqlen_q=700, seqlen_k=500, head_dim=128,
                  mask=Mask.causal(), block_m=64, block_n=128)


class Builds:
    """A build function that counts its calls (verify, then lower, as the runtime does)."""

    def __init__(self, problem=PROBLEM, schedule="symmetric_shift", workers=7):
        self.args, self.calls = (problem, schedule, workers), 0

    def __call__(self):
        self.calls += 1
        s = build_schedule(self.args[1], self.args[0], self.args[2])
        verify(s)
        return lower(s)


def same(a, b) -> bool:
    return (a.tasks == b.tasks and a.worker_offsets == b.worker_offsets
            and (a.schedule_name, a.problem, a.num_workers) == (b.schedule_name, b.problem,
                                                                b.num_workers))


def test_a_hit_returns_the_same_table_without_building(tmp_path):
    build = Builds()
    first, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, tmp_path)
    assert not hit and build.calls == 1
    second, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, tmp_path)
    assert hit and build.calls == 1
    assert same(first, second) and same(second, Builds()())


@pytest.mark.parametrize("change", ["problem", "schedule", "workers", "code"])
def test_anything_that_decides_the_table_misses(tmp_path, monkeypatch, change):
    plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, Builds(), tmp_path)
    problem, schedule, workers = PROBLEM, "symmetric_shift", 7
    if change == "problem":
        problem = Problem(**{**PROBLEM.to_dict(), "seqlen_q": 701})
    elif change == "schedule":
        schedule = "spt"
    elif change == "workers":
        workers = 8
    else:
        monkeypatch.setattr(plan_cache, "_code_digest", lambda: "an edited builder")
    build = Builds(problem, schedule, workers)
    plan, hit = plan_cache.get_or_build(problem, schedule, workers, build, tmp_path)
    assert not hit and build.calls == 1 and same(plan, Builds(problem, schedule, workers)())


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, Builds(), tmp_path)
    data_path, meta_path = plan_cache._paths(plan_cache.plan_key(PROBLEM, "symmetric_shift", 7),
                                             tmp_path)
    data = bytearray(data_path.read_bytes())
    if damage == "flip":
        data[100] ^= 1
        data_path.write_bytes(bytes(data))
    elif damage == "truncate":
        data_path.write_bytes(bytes(data[:-4]))
    else:
        meta_path.write_text("{not json")
    build = Builds()
    plan, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, tmp_path)
    assert not hit and build.calls == 1 and same(plan, Builds()())
    again, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, tmp_path)
    assert hit and same(again, plan)  # the rebuilt entry replaced the damaged one


def test_an_unwritable_cache_folder_only_costs_the_build(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    build = Builds()
    for _ in range(2):
        plan, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, blocker)
        assert not hit and same(plan, Builds()())
    assert build.calls == 2


def test_the_runtime_reads_its_plans_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DASHGEN_CACHE_DIR", str(tmp_path))
    runtime._plan_tensors.cache_clear()
    device = torch.device("cpu")
    plan, tasks, offsets = runtime._plan_tensors(PROBLEM, "symmetric_shift", 7, device)
    assert list(tmp_path.glob("plans/*/*.bin"))
    runtime._plan_tensors.cache_clear()

    def no_build(*args):
        raise AssertionError("built again although the cache holds the plan")
    monkeypatch.setattr(runtime, "_verified", no_build)
    again, tasks_again, offsets_again = runtime._plan_tensors(PROBLEM, "symmetric_shift", 7,
                                                              device)
    runtime._plan_tensors.cache_clear()
    assert same(plan, again)
    assert torch.equal(tasks, tasks_again) and torch.equal(offsets, offsets_again)
