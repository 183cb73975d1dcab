"""generated/ holds exactly what the emitter writes today: `dashgen emit --golden` into a fresh
folder matches it byte for byte. The goldens are the kernel variants select picks on the
benchmark's sweep, one backward of every other schedule and of the table walk, and a README."""
from __future__ import annotations

import contextlib
import difflib
import io

import pytest

from dashgen.cli import main
from dashgen.tools.emit import GOLDEN_COMMAND, GOLDEN_DIR
from dashgen.codegen.render import render_variant
from dashgen.schedule.builders import list_schedules

from benchmark_picks import all_picked_variants, other_schedule_variants

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
    """One .cu file per variant select picks on the sweep (tests/benchmark_picks.py) and per
    other schedule, each that variant's render; a named schedule's backward holds its policy."""
    directory = fresh[0]
    variants = {v.kernel_name: v for v in all_picked_variants() | other_schedule_variants()}
    sources = sorted(p.name[:-3] for p in directory.glob("*.cu"))
    assert sources == sorted(variants)
    for name in sources:
        text = (directory / f"{name}.cu").read_text()
        assert text == render_variant(variants[name]).text
        variant = variants[name]
        if getattr(variant, "policy_class", None):
            assert f"struct {variant.policy_class} " in text


def test_one_backward_per_schedule_and_no_task_tables(fresh):
    directory = fresh[0]
    schedules = {v.schedule for v in all_picked_variants() | other_schedule_variants()
                 if hasattr(v, "schedule")}
    assert schedules == {*list_schedules(), "table"}
    assert not list(directory.glob("*.tasks.json"))  # named schedules travel as code
    readme = (directory / "README.md").read_text()
    assert f"Regenerate with `{GOLDEN_COMMAND}`" in readme
    count = len(all_picked_variants() | other_schedule_variants())
    assert f"`<kernel>.cu`: {count} kernel variants" in readme
