"""lab/fa3_suite.py's counting, on a made-up junit report: passed, served (--count-only),
refused (dashgen's ValueError naming what it lacks), failed (anything else) and skipped cases,
and the summary table."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fa3_suite  # noqa: E402

JUNIT = """<?xml version="1.0"?>
<testsuites><testsuite name="pytest">
<testcase classname="test_flash_attn" name="test_flash_attn_output[1-1-64-False]"/>
<testcase classname="test_flash_attn" name="test_flash_attn_output[1-1-256-False]">
  <failure message="ValueError: head_dim must be one of (64, 96, 128), got 256">trace</failure>
</testcase>
<testcase classname="test_flash_attn" name="test_flash_attn_output[1-1-64-True]">
  <failure message="ValueError: qv: dashgen has no extra query-value product">trace</failure>
</testcase>
<testcase classname="test_flash_attn" name="test_flash_attn_varlen_output[5-64]">
  <failure message="AssertionError: assert 0.25 &lt;= 0.01">trace</failure>
</testcase>
<testcase classname="test_flash_attn" name="test_flash_attn_kvcache[1]">
  <error message="NotImplementedError: flash_attn_with_kvcache: dashgen serves attention for training; decoding against a KV cache is not served">trace</error>
</testcase>
<testcase classname="test_flash_attn" name="test_flash_attn_combine[2]"><skipped/></testcase>
<testcase classname="test_flash_attn" name="test_flash_attn_output[1-1-128-False]">
  <failure message="flash_attn_interface.CaseServed: served by dashgen_fwd_bf16_d128">t</failure>
</testcase>
</testsuite></testsuites>
"""


def test_cases_are_counted_by_outcome(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    rows = fa3_suite.cases(junit)
    assert [outcome for _, outcome, _ in rows] == [
        "passed", "refused", "refused", "failed", "refused", "skipped", "served"]
    text = fa3_suite.summary(rows)
    assert "| test | passed | served | refused | failed | skipped |" in text
    assert "| test_flash_attn_output | 1 | 1 | 2 | 0 | 0 |" in text
    assert "| test_flash_attn_varlen_output | 0 | 0 | 0 | 1 | 0 |" in text
    assert "| all | 1 | 1 | 3 | 1 | 1 |" in text
    assert "test_flash_attn_varlen_output[5-64]: AssertionError" in text


def test_a_wrong_result_is_never_counted_as_a_refusal():
    assert fa3_suite.classify(None) == "passed"
    assert fa3_suite.classify("AssertionError: dashgen has no chance") == "failed"
    assert fa3_suite.classify("RuntimeError: CUDA error") == "failed"
    assert fa3_suite.classify("ValueError: softcap must be 0 (no capping)") == "refused"
    assert fa3_suite.classify("NotImplementedError: a kernel for this") == "failed"


def test_failures_are_grouped_by_error_type(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    text = fa3_suite.summary(fa3_suite.cases(junit))
    assert "Failed (1) by error type:\n- 1 x AssertionError" in text


def test_the_count_only_conftest_replaces_the_reference_before_the_tests_import_it(tmp_path):
    """--count-only's conftest.py, beside stand-ins for FA3's test_util and the shim: a test
    module importing attention_ref after it gets the shim's no_reference."""
    import subprocess
    (tmp_path / "test_util.py").write_text(
        "def attention_ref(*args, **kwargs):\n    raise AssertionError('the real reference')\n")
    (tmp_path / "flash_attn_interface.py").write_text(
        "def no_reference(*args, **kwargs):\n    return 'stand-in'\n")
    (tmp_path / "conftest.py").write_text(fa3_suite.COUNT_ONLY_CONFTEST)
    result = subprocess.run(
        [sys.executable, "-c", "import conftest\nfrom test_util import attention_ref\n"
                               "print(attention_ref())"],
        cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "stand-in"
