"""The forward's overlap, read in its SASS: in every step with a successor, the softmax of tile
n + 1 runs while P V of tile n is on the tensor cores, i.e. all of that tile's exponentials
(MUFU.EX2) come between the wait that retires S of tile n + 1 (WARPGROUP.DEPBAR.LE gsb0, 0x1)
and the wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0). ptxas hoists the second wait into the
row-max shuffles' latency unless something orders the exponentials before it
(fwd_sm90.cuh, hold_before_wait; docs/design.md, `fwd-softmax-overlap`).

nvdisasm comes from the nvidia-cuda-nvdisasm wheel (the test extra).
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from dashgen.codegen.cubins import get_or_compile
from dashgen.codegen.render import render_variant
from dashgen.codegen.variants import ForwardVariant
from dashgen.tools.emit import golden_variants

# Each thread holds 64 scores of a 128-key tile: 64 exponentials, and 2 for the correction.
EXP_PER_TILE = 64
WAIT_S = re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1\b")
WAIT_PV = re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0\b")

FORWARDS = [v for v in golden_variants() if isinstance(v, ForwardVariant)] + [
    ForwardVariant("fp16", 64, False, persistent=True),
    ForwardVariant("fp16", 128, True, persistent=True),
    ForwardVariant("fp16", 64, True),
]


def nvdisasm() -> Path:
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for path in Path(location).glob("cu*/bin/nvdisasm"):
            return path
    pytest.fail("nvdisasm not found: install the test extra (nvidia-cuda-nvdisasm)")


def windows(sass: str) -> list[int]:
    """MUFU.EX2 count between each wait for S and the wait for P V that follows it."""
    counts, open_count = [], None
    for line in sass.splitlines():
        if WAIT_S.search(line):
            open_count = 0
        elif WAIT_PV.search(line) and open_count is not None:
            counts.append(open_count)
            open_count = None
        elif "MUFU.EX2" in line and open_count is not None:
            open_count += 1
    return counts


@pytest.mark.parametrize("variant", FORWARDS, ids=lambda v: v.kernel_name)
def test_softmax_exponentials_run_under_p_v(variant, tmp_path):
    cubin = get_or_compile(render_variant(variant))[0]
    path = tmp_path / f"{variant.kernel_name}.cubin"
    path.write_bytes(cubin.data)
    sass = subprocess.run([str(nvdisasm()), "-c", str(path)], check=True, capture_output=True,
                          text=True).stdout
    counts = windows(sass)
    # One step with a successor per K/V buffer phase at least (the loop body, unrolled or not).
    assert counts, "no wait for S followed by a wait for P V in the SASS"
    assert all(c >= EXP_PER_TILE for c in counts), counts


def test_windows_reads_the_order():
    sass = "\n".join(["HGMMA", "WARPGROUP.DEPBAR.LE gsb0, 0x1 ;", "MUFU.EX2 R1, R2 ;",
                      "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;", "MUFU.EX2 R3, R4 ;",
                      "WARPGROUP.DEPBAR.LE gsb0, 0x0 ;"])
    assert windows(sass) == [1]
