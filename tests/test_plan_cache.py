"""The disk cache of verified, lowered plans (dashgen.runtime.plans): hits return the same
table, anything doubtful rebuilds, and a cache folder that cannot be written never fails a
call."""
from __future__ import annotations

import hashlib
import json
from array import array

import pytest

torch = pytest.importorskip("torch")

from dashgen import Mask, Problem, build_schedule, verify  # noqa: E402
from dashgen.caches import CACHE_ENV, clear_caches  # noqa: E402
from dashgen.runtime import plans as plan_cache  # noqa: E402
from dashgen.schedule.lower import lower  # noqa: E402

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
        monkeypatch.setattr(plan_cache, "CODE_DIGEST", "an edited builder")
    build = Builds(problem, schedule, workers)
    plan, hit = plan_cache.get_or_build(problem, schedule, workers, build, tmp_path)
    assert not hit and build.calls == 1 and same(plan, Builds(problem, schedule, workers)())


def rewrite(data_path, meta_path, data: bytes, **meta) -> None:
    """An entry whose sidecar matches its (forged or odd) table."""
    old = json.loads(meta_path.read_text())
    data_path.write_bytes(data)
    meta_path.write_text(json.dumps({**old, "sha256": hashlib.sha256(data).hexdigest(), **meta}))


@pytest.mark.parametrize("damage", ["flip", "truncate", "sidecar", "sidecar-list",
                                    "sidecar-null", "count-null", "odd-length", "foreign-batch",
                                    "negative-rank", "offsets", "negative-count"])
def test_a_damaged_entry_is_rebuilt(tmp_path, damage):
    plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, Builds(), tmp_path)
    data_path, meta_path = plan_cache._PLANS.paths(
        plan_cache.plan_key(PROBLEM, "symmetric_shift", 7), tmp_path)
    data = bytearray(data_path.read_bytes())
    words = array("i", bytes(data))
    if damage == "flip":
        data[100] ^= 1
        data_path.write_bytes(bytes(data))
    elif damage == "truncate":
        data_path.write_bytes(bytes(data[:-4]))
    elif damage == "sidecar":
        meta_path.write_text("{not json")
    elif damage == "sidecar-list":
        meta_path.write_text("[1, 2]")
    elif damage == "sidecar-null":
        meta_path.write_text("null")
    elif damage == "count-null":
        rewrite(data_path, meta_path, bytes(data), num_tasks=None)
    elif damage == "odd-length":
        rewrite(data_path, meta_path, bytes(data) + b"\0")
    elif damage == "negative-count":  # -1 tasks: the length check alone would pass 16 bytes
        rewrite(data_path, meta_path, bytes(16), num_tasks=-1)
    else:  # self-consistent entries whose table the kernel could not address
        index = {"foreign-batch": 0, "negative-rank": 2, "offsets": len(words) - 2}[damage]
        words[index] = {"foreign-batch": 7 << 16, "negative-rank": -3, "offsets": 10 ** 6}[damage]
        rewrite(data_path, meta_path, words.tobytes())
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
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    clear_caches()
    device = torch.device("cpu")
    plan = plan_cache.cached_plan(PROBLEM, "symmetric_shift", 7)
    tasks, offsets, stream = plan_cache.device_tables(PROBLEM, "symmetric_shift", 7, device)
    assert list(tmp_path.glob("plans/*/*.bin")) and stream == 0  # no CUDA stream on the CPU
    clear_caches()

    def no_build(*args):
        raise AssertionError("built again although the cache holds the plan")
    monkeypatch.setattr(plan_cache, "verified_plan", no_build)
    again = plan_cache.cached_plan(PROBLEM, "symmetric_shift", 7)
    tasks_again, offsets_again, _ = plan_cache.device_tables(PROBLEM, "symmetric_shift", 7,
                                                             device)
    clear_caches()
    assert same(plan, again) and same(plan, Builds()())
    assert torch.equal(tasks, tasks_again) and torch.equal(offsets, offsets_again)
    assert tasks.dtype == torch.int32 and tasks.tolist() == list(plan.tasks)
    assert offsets.tolist() == list(plan.worker_offsets)


def test_plan_tensors_are_the_table_by_task():
    plan = Builds()()
    words, offsets = plan_cache.plan_tensors(plan)
    assert words.shape == (plan.num_tasks, 4) and words.dtype == torch.int64
    assert words.flatten().tolist() == list(plan.tasks)
    assert offsets.tolist() == list(plan.worker_offsets)
    assert plan_cache.addressable(plan)


def test_unreadable_planning_code_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_cache, "CODE_DIGEST", None)
    build = Builds()
    for _ in range(2):
        plan, hit = plan_cache.get_or_build(PROBLEM, "symmetric_shift", 7, build, tmp_path)
        assert not hit and same(plan, Builds()())
    assert build.calls == 2 and not list(tmp_path.rglob("*.bin"))


def test_the_code_digest_skips_editor_lock_files(tmp_path):
    """A dangling `.#name.py` link (an editor's lock) in builders/ neither breaks the digest
    nor changes it."""
    import shutil
    package = tmp_path / "schedule"
    shutil.copytree(plan_cache._SCHEDULE_PACKAGE, package)
    clean = plan_cache.source_digest(package)
    assert clean is not None and clean == plan_cache.source_digest() == plan_cache.CODE_DIGEST
    (package / "builders" / ".#fa3.py").symlink_to(tmp_path / "nowhere")
    assert plan_cache.source_digest(package) == clean
    (package / "builders" / "fa3.py").write_text("# edited\n")
    assert plan_cache.source_digest(package) != clean
    (package / "verify.py").unlink()
    assert plan_cache.source_digest(package) is None  # unreadable: then nothing is cached


@pytest.mark.parametrize("hit, seconds, said", [(False, 2.0, True), (False, 0.2, False),
                                                (True, 2.0, False)])
def test_a_slow_new_plan_is_announced(monkeypatch, capsys, hit, seconds, said):
    """A long sequence's first backward waits for its plan: a line on stderr says so."""
    plan = Builds()()
    monkeypatch.setattr(plan_cache, "get_or_build", lambda *a: (plan, hit))
    clock = iter([100.0, 100.0 + seconds])
    monkeypatch.setattr(plan_cache, "_clock", lambda: next(clock))
    clear_caches()
    assert plan_cache.cached_plan(PROBLEM, "symmetric_shift", 7) is plan
    clear_caches()
    err = capsys.readouterr().err
    assert ("built and verified the symmetric_shift schedule" in err) == said
    if said:
        assert f"({plan.num_tasks} tasks, 7 workers) in {seconds:.1f} s" in err
