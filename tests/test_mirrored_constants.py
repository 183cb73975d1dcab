"""Numbers the runtime and the kernels must agree on, each written once in C++ and once in Python:
thread counts the launches use, rows a preprocess block covers, the watchdog's record layout,
the trace's columns, the stall roles and the schedules' ids. A disagreement would launch or read
wrongly without an error, so each Python constant is checked against the header that defines it
(read as text: no compiler needed)."""
from __future__ import annotations

import re

import pytest

from dashgen.codegen.render import include_dir
from dashgen.codegen.variants import (AUX_THREADS, PREP_ROWS_PER_BLOCK, SCHEDULE_POLICIES,
                                      STALL_MAGIC, STALL_ROLES, STALL_WORDS, THREADS,
                                      TRACE_COLUMNS)
from dashgen.runtime.varlen import PLAN_THREADS
from dashgen.schedule.builders import BUILDERS


def header(path: str) -> str:
    return (include_dir() / "dashgen" / path).read_text()


def constant(text: str, name: str, scope: str | None = None) -> int:
    """The value of `constexpr <type> name = <int>;` in `text` (inside `struct scope { ... };`
    where given). Exactly one definition, or the test fails naming it."""
    if scope is not None:
        found = re.search(r"struct %s\b[^{]*\{(.*?)\n\};" % re.escape(scope), text, re.S)
        assert found, f"struct {scope} not found"
        text = found.group(1)
    values = re.findall(r"constexpr\s+[\w:]+\s+%s\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;" % name, text)
    assert len(values) == 1, f"{name}: {len(values)} definitions"
    return int(values[0], 0)


@pytest.mark.parametrize("path, scope, name, mirror", [
    ("attn/bwd_sm90.cuh", "AttnBwdSm90", "kThreads", THREADS),
    ("attn/fwd_sm90.cuh", "AttnFwdSm90", "kThreads", THREADS),
    ("attn/prepost.cuh", None, "kThreads", AUX_THREADS),
    ("attn/prepost.cuh", None, "kRowsPerBlock", PREP_ROWS_PER_BLOCK),
    ("attn/pack_plan.cuh", "AttnPackPlan", "kThreads", PLAN_THREADS),
    ("attn/params.cuh", None, "kStallMagic", STALL_MAGIC),
    ("attn/params.cuh", None, "kStallWords", STALL_WORDS),
    ("ptx/timer.cuh", None, "kTraceColumns", TRACE_COLUMNS),
], ids=lambda x: x if isinstance(x, str) else None)
def test_python_constant_equals_the_kernels(path, scope, name, mirror):
    assert constant(header(path), name, scope) == mirror


def test_stall_roles_are_the_kernels_roles():
    enum = re.search(r"enum StallRole : u32 \{([^}]*)\}", header("attn/bwd_scheduler.cuh"))
    roles = {int(value) for value in re.findall(r"=\s*(\d+)", enum.group(1))}
    assert roles == set(STALL_ROLES)


def test_each_policy_class_carries_its_builders_id():
    """A policy's kId is the id the watchdog reports; the kernel renders the builder's
    kernel_id as kScheduleId. A listed schedule shares its policy's class with another id."""
    for name, (path, cls, _) in SCHEDULE_POLICIES.items():
        if path is None or BUILDERS[name].listed:
            continue
        assert constant(header(f"sched/{path}"), "kId", cls) == BUILDERS[name].kernel_id, name
    ids = [b.kernel_id for b in BUILDERS.values()]
    assert len(ids) == len(set(ids)) and 0 not in ids  # 0 is the table walk's


def test_a_wrong_mirror_is_caught():
    with pytest.raises(AssertionError):
        assert constant(header("attn/prepost.cuh"), "kThreads") == AUX_THREADS + 1
    with pytest.raises(AssertionError, match="kNoSuchConstant: 0 definitions"):
        constant(header("attn/prepost.cuh"), "kNoSuchConstant")
