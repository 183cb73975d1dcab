"""generated/ holds exactly what the emitter writes today: a fresh render matches byte for byte."""
from __future__ import annotations

import difflib
import json
from array import array
from itertools import product

import pytest

from dashgen.codegen.emit import (GOLDEN_COMMAND, GOLDEN_DIR, GOLDEN_WORKERS, golden_files, golden_problem,
                          write_golden)
from dashgen.codegen.variants import Sm90BwdConfig, Sm90FwdConfig
from dashgen.schedule.lower import KernelPlan, decode
from dashgen.schedule.builders import build_schedule

DIFF_LINES = 60


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    directory = tmp_path_factory.mktemp("generated")
    write_golden(directory)
    return directory


def _names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_golden_file_set_matches(fresh):
    expected, actual = _names(fresh), _names(GOLDEN_DIR) if GOLDEN_DIR.is_dir() else []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing and not extra, (
        f"generated/ is out of date: missing {missing}, not produced by the emitter {extra}; "
        f"regenerate with: {GOLDEN_COMMAND}")


@pytest.mark.parametrize("name", sorted(golden_files()))
def test_golden_file_matches(fresh, name):
    want = (fresh / name).read_bytes()
    path = GOLDEN_DIR / name
    have = path.read_bytes() if path.is_file() else b""
    if have != want:
        diff = list(difflib.unified_diff(
            have.decode(errors="replace").splitlines(), want.decode(errors="replace").splitlines(),
            f"generated/{name}", f"fresh render of {name}", lineterm=""))
        shown = "\n".join(diff[:DIFF_LINES])
        more = f"\n... {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
        pytest.fail(f"generated/{name} differs from a fresh render:\n{shown}{more}\n"
                    f"regenerate with: {GOLDEN_COMMAND}", pytrace=False)


def test_golden_tables_decode_to_their_schedules():
    for name, text in golden_files().items():
        if not name.endswith(".tasks.json"):
            continue
        data = json.loads(text)
        schedule_name, head_dim, mask = name[:-len(".tasks.json")].rsplit("_", 2)
        problem = golden_problem(int(head_dim[len("hdim"):]), mask)
        assert data["problem"] == problem.to_dict() and data["num_workers"] == GOLDEN_WORKERS
        plan = KernelPlan(data["schedule"], problem, data["num_workers"],
                          array("i", [w for row in data["tasks"] for w in row]),
                          array("i", data["worker_offsets"]))
        assert decode(plan) == build_schedule(schedule_name, problem, GOLDEN_WORKERS).workers


def test_golden_renders_are_the_serving_kernels():
    """bf16 at head_dim 64 and 128 renders the Hopper forward and backward, and tables in the
    backward's tiles (128x128 at head_dim 64, 64x128 at 128); both deterministic and not, both masks."""
    files = golden_files()
    want = set()
    for head_dim in (64, 128):
        for causal, deterministic in product((False, True), (False, True)):
            want.add(Sm90BwdConfig("bf16", head_dim, causal,
                                   deterministic=deterministic).kernel_name)
            want.add(Sm90FwdConfig("bf16", head_dim, causal).kernel_name)
    assert {name[:-3] for name in files if name.endswith(".cu")} == want
    for head_dim, blocks in ((64, (128, 128)), (128, (64, 128))):
        for mask in ("full", "causal"):
            problem = golden_problem(head_dim, mask)
            assert (problem.block_m, problem.block_n) == blocks
        tables = [json.loads(text) for name, text in files.items()
                  if name.endswith(".tasks.json") and f"_hdim{head_dim}_" in name]
        assert tables and all((t["problem"]["block_m"], t["problem"]["block_n"]) == blocks
                              for t in tables)
    assert "head_dim 128: blocks 64x128 (4 KV tiles per head)" in files["README.md"]
    assert "head_dim 64: blocks 128x128 (4 KV tiles per head)" in files["README.md"]
    assert "head_dim 64: the Hopper forward `dashgen_attn_fwd_sm90_*`" in files["README.md"]


def test_write_golden_removes_only_stale_files_it_owns(tmp_path):
    (tmp_path / "old_schedule_hdim64_full.tasks.json").write_text("{}")
    (tmp_path / "dashgen_attn_fwd_old.cu").write_text("//")
    (tmp_path / "notes.txt").write_text("mine")
    written, removed = write_golden(tmp_path)
    assert removed == ["dashgen_attn_fwd_old.cu", "old_schedule_hdim64_full.tasks.json"]
    assert _names(tmp_path) == sorted(written + ["notes.txt"])
