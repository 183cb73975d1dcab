"""The check of a pack's offsets on the GPU (templates/include/dashgen/attn/pack_check.cuh),
compiled as host code with g++: over hypothesis-drawn offsets, valid and broken, some
sequence's pack_fault is nonzero exactly when the host's check of offsets on the CPU
(dashgen.runtime.op_varlen) refuses them, so offsets on the GPU keep the same contract. And the
host side: a filled fault record raises PackOffsetsError naming the offsets."""
from __future__ import annotations

import subprocess

import pytest
import torch
from hypothesis import given, settings, strategies as st

from dashgen.runtime import pack_faults
from dashgen.runtime.op_varlen import _check_cpu_offsets
from test_policy_header import build_driver, needs_gxx

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
#include "dashgen/attn/pack_check.cuh"

// argv: total, longest, then the batch + 1 offsets. Prints each sequence's fault code.
int main(int argc, char** argv) {
  const int total = std::atoi(argv[1]), longest = std::atoi(argv[2]);
  std::vector<int> cu;
  for (int i = 3; i < argc; ++i) cu.push_back(std::atoi(argv[i]));
  const int batch = static_cast<int>(cu.size()) - 1;
  for (int b = 0; b < batch; ++b)
    std::printf("%d ", dashgen::pack_fault(cu[b], cu[b + 1], b, batch, total, longest));
  std::printf("\n");
  return 0;
}
"""


@pytest.fixture(scope="module")
def faults(tmp_path_factory):
    binary = build_driver(tmp_path_factory, "pack_check", DRIVER)

    def run(offsets: list[int], total: int, longest: int) -> list[int]:
        out = subprocess.run([str(binary), str(total), str(longest), *map(str, offsets)],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return [int(x) for x in out.split()]
    return run


def host_refuses(offsets: list[int], total: int, longest: int) -> bool:
    """Whether the host's check of CPU offsets (both arrays alike) raises."""
    q = torch.empty(total, 1, 64)
    cu = torch.tensor(offsets, dtype=torch.int32)
    try:
        _check_cpu_offsets(q, q, q, cu, cu, longest, longest)
    except ValueError:
        return True
    return False


@st.composite
def offsets(draw):
    """batch + 1 offsets from lengths 0..40, then perhaps one offset moved or the total/longest
    changed: about half the draws are broken."""
    lengths = draw(st.lists(st.integers(0, 40), min_size=1, max_size=6))
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    total, longest = cu[-1], max(lengths)
    kind = draw(st.sampled_from(["valid", "offset", "total", "longest"]))
    if kind == "offset":
        i = draw(st.integers(0, len(cu) - 1))
        cu[i] += draw(st.integers(-50, 50).filter(lambda d: d != 0))
    elif kind == "total":
        total += draw(st.integers(-20, 20))
        total = max(total, 0)
    elif kind == "longest":
        longest = draw(st.integers(0, longest + 2))
    return cu, total, longest


@needs_gxx
@settings(max_examples=300, deadline=None)
@given(case=offsets())
def test_a_fault_is_found_exactly_where_the_host_refuses(faults, case):
    cu, total, longest = case
    codes = faults(cu, total, longest)
    assert len(codes) == len(cu) - 1
    assert all(0 <= c <= 5 for c in codes), codes
    assert any(codes) == host_refuses(cu, total, longest), (cu, total, longest, codes)


@needs_gxx
def test_each_fault_has_its_code(faults):
    assert faults([0, 3, 5], 5, 3) == [0, 0]
    assert faults([1, 3, 5], 5, 3) == [1, 0]      # does not start at 0
    assert faults([0, 4, 3, 5], 5, 4) == [0, 2, 0]  # falls
    assert faults([0, 3, 7], 5, 4) == [0, 3]      # past the packed tokens
    assert faults([0, 3, 4], 5, 4) == [0, 4]      # ends short of them
    assert faults([0, 3, 5], 5, 2) == [5, 0]      # a sequence longer than max_seqlen
    assert faults([0, 0, 0], 0, 0) == [0, 0]      # empty sequences


def test_a_filled_record_raises_naming_the_offsets():
    device = torch.device("cuda", 0)
    address = pack_faults.record(device)
    buf = pack_faults._records[0]
    assert buf.data_ptr() == address and int(buf.abs().sum()) == 0
    pack_faults.check()  # an empty record raises nothing
    try:
        # backward, cu_seqlens_k, too long: sequence 2 of 4 spans [900, 1400), max_seqlen_k=400
        buf[1:10] = torch.tensor([2, 1, 5, 2, 900, 1400, 2000, 400, 4], dtype=torch.int32)
        pack_faults.check()  # no magic yet: the record is not complete
        buf[0] = pack_faults.PACK_RECORD_MAGIC
        with pytest.raises(pack_faults.PackOffsetsError) as info:
            pack_faults.check()
        text = str(info.value)
        for part in ("cu_seqlens_k (on the GPU)", "max_seqlen_k=400", "sequence 2 of 4",
                     "[900, 1400)", "500 tokens", "backward", "cannot run more work"):
            assert part in text, text
        assert isinstance(info.value, ValueError)
        buf[1:10] = torch.tensor([1, 0, 4, 3, 0, 7, 9, 10, 4], dtype=torch.int32)
        with pytest.raises(pack_faults.PackOffsetsError, match=r"cu_seqlens_q .* does not end "
                                                                r"at the packed tokens \(9 rows of q\)"):
            pack_faults.check()
    finally:
        buf.zero_()
