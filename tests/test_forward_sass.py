"""The forward's overlap, read in its SASS: in every step with a successor, the softmax of tile
n + 1 runs while P V of tile n is on the tensor cores, i.e. all of that tile's exponentials
(MUFU.EX2) come between the wait that retires S of tile n + 1 (WARPGROUP.DEPBAR.LE gsb0, 0x1)
and the wait for P V (WARPGROUP.DEPBAR.LE gsb0, 0x0). ptxas hoists the second wait into the
row-max shuffles' latency unless something orders the exponentials before it
(fwd_sm90.cuh, hold_before_wait; docs/design.md, `fwd-softmax-overlap`).

The instructions are read from the cubin's .text section directly: sm_90 instructions are 16
bytes; the two kinds counted here are told apart by fields read off nvdisasm 13.2's listing of
these kernels (NVRTC is pinned, so the encodings are too). Where nvdisasm is installed
(the nvidia-cuda-nvdisasm wheel), a second test checks the decoding against its listing.
"""
from __future__ import annotations

import importlib.util
import re
import struct
import subprocess
from pathlib import Path

import pytest

from dashgen.codegen.compile import elf_section
from dashgen.codegen.cubins import get_or_compile
from dashgen.codegen.render import render_variant
from dashgen.codegen.variants import ForwardVariant
from dashgen.tools.emit import golden_variants

# Each thread holds 64 scores of a 128-key tile: 64 exponentials, and 2 for the correction.
EXP_PER_TILE = 64
MUFU, WARPGROUP = 0x308, 0x9C5  # the low word's 12-bit opcodes
MUFU_EX2 = 0x08                 # MUFU's function, bits 8-15 of the high word (LG2 0x0c, RCP 0x10)

FORWARDS = [v for v in golden_variants() if isinstance(v, ForwardVariant)] + [
    ForwardVariant("fp16", 64, False, persistent=True),
    ForwardVariant("fp16", 128, True, persistent=True),
    ForwardVariant("fp16", 64, True),
]


def decode(text: bytes) -> list[tuple[str, int] | None]:
    """Per instruction: ("ex2", 0), ("wait", N) for WARPGROUP.DEPBAR.LE gsb0, N, else None."""
    out = []
    for at in range(0, len(text), 16):
        low, high = struct.unpack_from("<QQ", text, at)
        if low & 0xFFF == MUFU and (high >> 8) & 0xFF == MUFU_EX2:
            out.append(("ex2", 0))
        elif low & 0xFFF == WARPGROUP and (low >> 47) & 1:  # bit 47: DEPBAR, not ARRIVE
            out.append(("wait", (high >> 8) & 0xFF))
        else:
            out.append(None)
    return out


def windows(kinds) -> list[int]:
    """MUFU.EX2 count between each wait for S (wait 1) and the wait for P V (wait 0) after it."""
    counts, open_count = [], None
    for kind in kinds:
        if kind == ("wait", 1):
            open_count = 0
        elif kind == ("wait", 0) and open_count is not None:
            counts.append(open_count)
            open_count = None
        elif kind == ("ex2", 0) and open_count is not None:
            open_count += 1
    return counts


@pytest.fixture(scope="module")
def cubin():
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = get_or_compile(render_variant(variant))[0].data
        return cache[variant]
    return get


@pytest.mark.parametrize("variant", FORWARDS, ids=lambda v: v.kernel_name)
def test_softmax_exponentials_run_under_p_v(variant, cubin):
    counts = windows(decode(elf_section(cubin(variant), f".text.{variant.kernel_name}")))
    # At least the loop body's step with a successor.
    assert counts, "no wait for S followed by a wait for P V in the SASS"
    assert all(c >= EXP_PER_TILE for c in counts), counts


def test_windows_reads_the_order():
    kinds = [None, ("wait", 1), ("ex2", 0), ("wait", 0), ("ex2", 0), ("wait", 0)]
    assert windows(kinds) == [1]


def _nvdisasm() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    for location in (spec.submodule_search_locations or []) if spec else []:
        for path in Path(location).glob("cu*/bin/nvdisasm"):
            return path
    return None


@pytest.mark.skipif(_nvdisasm() is None, reason="nvdisasm (nvidia-cuda-nvdisasm) not installed")
@pytest.mark.parametrize("variant", FORWARDS[:3], ids=lambda v: v.kernel_name)
def test_decoding_matches_nvdisasm(variant, cubin, tmp_path):
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin(variant))
    # A forward cubin holds one function, so every instruction line is the kernel's.
    listing = subprocess.run([str(_nvdisasm()), "-c", str(path)], check=True,
                             capture_output=True, text=True).stdout
    theirs = []
    for line in listing.splitlines():
        if not re.search(r"/\*[0-9a-f]{4,}\*/", line):
            continue  # not an instruction line
        if "MUFU.EX2" in line:
            theirs.append(("ex2", 0))
        elif m := re.search(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x([0-9a-f]+)", line):
            theirs.append(("wait", int(m.group(1), 16)))
        else:
            theirs.append(None)
    ours = decode(elf_section(cubin(variant), f".text.{variant.kernel_name}"))
    assert len(ours) == len(theirs)
    assert ours == theirs
