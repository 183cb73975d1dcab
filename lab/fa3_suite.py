"""FlashAttention-3's own tests run against dashgen through its FA3 interface: how many of FA3's
cases dashgen serves, and whether every served one passes.

FA3's hopper/test_flash_attn.py and test_flash_attn_bwd_determinism.py (with its test_util.py
and padding.py) are extracted from the anchor kit's source tarball into a scratch folder beside
a `flash_attn_interface` module, lab/fa3_shim.py: dashgen.interfaces.flash_attn_interface's
functions (FA3's decoding functions, which its tests import, raise NotImplementedError naming
themselves there) and the private backward the determinism tests call. pytest runs there with the arguments given (e.g.
-k "test_flash_attn_output and not fp8"); each case is then counted as passed, refused (a
ValueError naming an argument dashgen lacks, before any kernel, or a decoding function's
refusal) or failed (any other error or a wrong result), per test function, with the refusals'
reasons counted.

PYTHONPATH=. python3 lab/fa3_suite.py --tarball ../shared/anchors/src/fa3.tar.gz \\
    --out fa3_suite [--tests test_flash_attn.py test_flash_attn_bwd_determinism.py] \\
    [--count-only] -- -k "test_flash_attn_output" -x

--count-only counts what dashgen serves without running a kernel: each case stops at the first
kernel dashgen would load (fa3_shim.CaseServed, counted "served") or at its refusal: no kernel
is compiled or run. Whether the served cases pass is what a run without it counts. FA3's tests
form two O(seqlen^2) references before they call the interface; a counted case never reads
them, so a conftest.py puts fa3_shim.no_reference (zeros of their shapes) in test_util's
attention_ref for the count. Before it, the determinism file alone (12,096 cases) took 384 s
in six pytest workers on an H100 and 1,380 of its cases ran out of GPU memory (2026-12-07).

FA3's tests import einops (pure Python: a copy on PYTHONPATH serves) and need a CUDA GPU to be
collected. --count-only still makes each case's tensors on the GPU, and pytest workers (-n)
multiply that memory: run it alone (in eight workers beside GPU tests, on an 80 GB H100, it and
the tests ran out of memory, 2026-12-07).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

FILES = ("hopper/test_flash_attn.py", "hopper/test_flash_attn_bwd_determinism.py",
         "hopper/test_util.py", "hopper/padding.py")
SHIM = Path(__file__).with_name("fa3_shim.py")  # copied in as flash_attn_interface.py
COUNT_ONLY_ENV = "DASHGEN_FA3_SUITE_COUNT_ONLY"  # read by fa3_shim
# --count-only: loaded by pytest before FA3's test modules import test_util's names.
COUNT_ONLY_CONFTEST = """import flash_attn_interface
import test_util

test_util.attention_ref = flash_attn_interface.no_reference
"""

# A refusal: dashgen's ValueError naming what it lacks, raised before any kernel (the interface
# and dashgen.attention's checks word them so), or the NotImplementedError of FA3's decoding
# functions, which the interface imports and refuses by name.
REFUSAL = re.compile(r"ValueError: (\w+(?: must be one of| must be| has|:)|.*dashgen has no)"
                     r"|NotImplementedError: \w+: dashgen serves attention for training")


# --count-only: the first kernel a case would load raises fa3_shim.CaseServed instead.
SERVED = re.compile(r"CaseServed: ")
OUTCOMES = ("passed", "served", "refused", "failed", "skipped")


def classify(message: str | None) -> str:
    """'passed', 'served' (--count-only), 'refused' or 'failed' from a case's failure text
    (None: it passed)."""
    if message is None:
        return "passed"
    if SERVED.search(message):
        return "served"
    return "refused" if REFUSAL.search(message) else "failed"


def cases(junit: Path) -> list[tuple[str, str, str]]:
    """(case id, outcome, first line of its failure) from pytest's junit XML."""
    out = []
    for case in ElementTree.parse(junit).iter("testcase"):
        name = case.get("name", "")
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            out.append((name, "skipped", ""))
            continue
        text = None if problem is None else (problem.get("message") or problem.text or "")
        out.append((name, classify(text), (text or "").splitlines()[0][:300] if text else ""))
    return out


def summary(rows: list[tuple[str, str, str]]) -> str:
    total = Counter(outcome for _, outcome, _ in rows)
    by_test = Counter((name.split("[")[0], outcome) for name, outcome, _ in rows)
    reasons = Counter(reason.split(":")[1].strip() if ":" in reason else reason
                      for _, outcome, reason in rows if outcome == "refused")
    lines = ["| test | " + " | ".join(OUTCOMES) + " |", "|---|" + "---|" * len(OUTCOMES)]
    for test in sorted({t for t, _ in by_test}):
        lines.append(f"| {test} | " + " | ".join(str(by_test[test, o]) for o in OUTCOMES)
                     + " |")
    lines.append("| all | " + " | ".join(str(total[o]) for o in OUTCOMES) + " |")
    lines.append("")
    lines.append("Refusals by what dashgen lacks (first words of the ValueError):")
    lines += [f"- {count} x {reason}" for reason, count in reasons.most_common(12)]
    failed = [(name, reason) for name, outcome, reason in rows if outcome == "failed"]
    if failed:
        lines.append("")
        lines.append(f"Failed ({len(failed)}) by error type:")
        kinds = Counter(reason.split(":")[0].split(".")[-1] or "?" for _, reason in failed)
        lines += [f"- {count} x {kind}" for kind, count in kinds.most_common(12)]
        lines.append("")
        lines.append("The first 10:")
        lines += [f"- {name}: {reason}" for name, reason in failed[:10]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tarball", required=True, help="the anchor kit's src/fa3.tar.gz")
    parser.add_argument("--out", default="fa3_suite", help="folder for cases.json, summary.md")
    parser.add_argument("--tests", nargs="+", default=["test_flash_attn.py"],
                        choices=[Path(f).name for f in FILES if "/test_flash" in f],
                        help="FA3's test files to run (default test_flash_attn.py)")
    parser.add_argument("--count-only", action="store_true",
                        help="stop each case at the first kernel dashgen would load (served) "
                             "or its refusal: what dashgen serves, without running kernels")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    root = Path(__file__).resolve().parent.parent
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch, tarfile.open(args.tarball) as tar:
        folder = Path(scratch)
        members = tar.getmembers()
        for name in FILES:  # wherever the tarball's top folder puts hopper/
            member = next((m for m in members if m.name == name or m.name.endswith("/" + name)),
                          None)
            if member is None:
                raise SystemExit(f"--tarball: {name} not found in {args.tarball}")
            (folder / Path(name).name).write_bytes(tar.extractfile(member).read())
        (folder / "flash_attn_interface.py").write_text(SHIM.read_text())
        junit = out / "junit.xml"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(root),
                                                           os.environ.get("PYTHONPATH", "")]))
        if args.count_only:
            env[COUNT_ONLY_ENV] = "1"
            (folder / "conftest.py").write_text(COUNT_ONLY_CONFTEST)
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={junit.resolve()}", *args.tests,
                        *args.pytest_args], cwd=folder, env=env, check=False)
    rows = cases(junit)
    (out / "cases.json").write_text(json.dumps(rows, indent=0))
    text = summary(rows)
    (out / "summary.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
