"""generated/ holds exactly what the emitter writes today: `dashgen emit --golden` into a fresh
folder matches it byte for byte. The goldens are the kernel variants select picks on the
benchmark's sweep, every schedule's task table on the canonical problem, and a README."""
from __future__ import annotations

import contextlib
import difflib
import io
import json
from array import array

import pytest

from dashgen.cli import main
from dashgen.tools.emit import (GOLDEN_COMMAND, GOLDEN_DIR, GOLDEN_WORKERS, golden_problem,
                                  masks_served)
from dashgen.codegen.render import render_variant
from dashgen.schedule.builders import build_schedule, list_schedules
from dashgen.schedule.lower import KernelPlan, decode

from benchmark_picks import all_picked_variants

DIFF_LINES = 60
OWNED = ("*.cu", "*.tasks.json", "README.md")  # what the emitter writes and removes in generated/
STALE = ("old_schedule_hdim64_full.tasks.json", "dashgen_fwd_old.cu")
FOREIGN = "notes.txt"


def owned_names(directory) -> list[str]:
    return sorted({p.name for pattern in OWNED for p in directory.glob(pattern) if p.is_file()})


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """(folder, stdout) of `dashgen emit --golden --out` into a folder holding two stale files
    the emitter owns and one it does not."""
    directory = tmp_path_factory.mktemp("generated")
    for name in STALE:
        (directory / name).write_text("stale")
    (directory / FOREIGN).write_text("mine")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["emit", "--golden", "--out", str(directory)])
    return directory, out.getvalue()


def test_the_command_reports_what_it_wrote_and_removed(fresh):
    directory, stdout = fresh
    written = owned_names(directory)
    assert stdout == (f"wrote {len(written)} golden files to {directory}; removed stale "
                      f"{', '.join(sorted(STALE))}\n")
    assert not any((directory / name).exists() for name in STALE)
    assert (directory / FOREIGN).read_text() == "mine"  # not the emitter's: left alone
    assert GOLDEN_COMMAND == "dashgen emit --golden"


def test_golden_file_set_matches(fresh):
    expected = owned_names(fresh[0])
    actual = owned_names(GOLDEN_DIR) if GOLDEN_DIR.is_dir() else []
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    assert not missing and not extra, (
        f"generated/ is out of date: missing {missing}, not produced by the emitter {extra}; "
        f"regenerate with: {GOLDEN_COMMAND}")


@pytest.mark.parametrize("name", owned_names(GOLDEN_DIR) if GOLDEN_DIR.is_dir() else [])
def test_golden_file_matches(fresh, name):
    path = fresh[0] / name
    want = path.read_bytes() if path.is_file() else b""
    have = (GOLDEN_DIR / name).read_bytes()
    if have != want:
        diff = list(difflib.unified_diff(
            have.decode(errors="replace").splitlines(), want.decode(errors="replace").splitlines(),
            f"generated/{name}", f"fresh render of {name}", lineterm=""))
        shown = "\n".join(diff[:DIFF_LINES])
        more = f"\n... {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
        pytest.fail(f"generated/{name} differs from a fresh render:\n{shown}{more}\n"
                    f"regenerate with: {GOLDEN_COMMAND}", pytrace=False)


def test_the_kernel_sources_are_the_variants_the_benchmark_runs(fresh):
    """One .cu file per variant select picks on the sweep (tests/benchmark_picks.py), each that
    variant's render."""
    directory = fresh[0]
    variants = {v.kernel_name: v for v in all_picked_variants()}
    sources = sorted(p.name[:-3] for p in directory.glob("*.cu"))
    assert sources == sorted(variants)
    for name in sources:
        assert (directory / f"{name}.cu").read_text() == render_variant(variants[name]).text


def test_the_tables_are_every_schedule_on_every_mask_it_serves(fresh):
    directory = fresh[0]
    tables = sorted(p.name for p in directory.glob("*.tasks.json"))
    assert tables == sorted(f"{name}_hdim{d}_{mask}.tasks.json" for name in list_schedules()
                            for d in (64, 128) for mask in masks_served(name))


def test_golden_tables_decode_to_their_schedules(fresh):
    for path in fresh[0].glob("*.tasks.json"):
        data = json.loads(path.read_text())
        schedule_name, head_dim, mask = path.name[:-len(".tasks.json")].rsplit("_", 2)
        problem = golden_problem(int(head_dim[len("hdim"):]), mask)
        assert data["problem"] == problem.to_dict() and data["num_workers"] == GOLDEN_WORKERS
        assert data["schedule"] == schedule_name
        plan = KernelPlan(data["schedule"], problem, data["num_workers"],
                          array("i", [w for row in data["tasks"] for w in row]),
                          array("i", data["worker_offsets"]))
        assert decode(plan) == build_schedule(schedule_name, problem, GOLDEN_WORKERS).workers


def test_the_tables_are_in_the_backwards_tiles_and_the_readme_says_so(fresh):
    directory = fresh[0]
    for head_dim, blocks in ((64, (128, 128)), (128, (64, 128))):
        for mask in ("full", "causal"):
            problem = golden_problem(head_dim, mask)
            assert (problem.block_m, problem.block_n) == blocks
        tables = [json.loads(p.read_text()) for p in directory.glob(f"*_hdim{head_dim}_*.json")]
        assert tables and all((t["problem"]["block_m"], t["problem"]["block_n"]) == blocks
                              for t in tables)
    readme = (directory / "README.md").read_text()
    assert f"Regenerate with `{GOLDEN_COMMAND}`" in readme
    assert "head_dim 128: blocks 64x128 (4 KV tiles per head)" in readme
    assert "head_dim 64: blocks 128x128 (4 KV tiles per head)" in readme
    assert f"the {len(all_picked_variants())} kernel variants that dashgen.runtime.select" in readme
