"""templates/include/dashgen/attn/mask.cuh compiled as host code with g++: mask_reaches, the
per-task test that lets a task skip the per-element mask, is true exactly when some (key, query
row) pair of the task is masked, on hypothesis-drawn tasks (both masks, seqlen_q != seqlen_k,
tiles past the sequence's end)."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from hypothesis import given, settings, strategies as st

from dashgen.codegen.render import include_dir

DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "dashgen/attn/mask.cuh"

// argv: "window", first_key, keys, first_row, rows, keys_end, diagonal, left, right: as below
// for window_reaches and window_masked.
static int window(char** argv) {
  int a[8];
  for (int i = 0; i < 8; ++i) a[i] = std::atoi(argv[i + 2]);
  const int first_key = a[0], last_key = a[0] + a[1] - 1, first_row = a[2];
  const int last_row = a[2] + a[3] - 1, keys_end = a[4], diagonal = a[5], left = a[6];
  const int right = a[7];
  bool any = false;
  for (int key = first_key; key <= last_key; ++key)
    for (int row = first_row; row <= last_row; ++row)
      any = any || dashgen::window_masked(key, row, keys_end, diagonal, left, right);
  const bool reaches = dashgen::window_reaches(first_key, last_key, first_row, last_row,
                                               keys_end, diagonal, left, right);
  // Every pair against the window written plainly in 64-bit arithmetic, where no bound can
  // overflow: window_masked's unsigned range compare must agree pair by pair.
  long long wrong = 0;
  for (int key = first_key; key <= last_key; ++key)
    for (int row = first_row; row <= last_row; ++row) {
      const long long anchor = static_cast<long long>(row) + diagonal;
      const bool plain = key >= keys_end || key > anchor + right || key < anchor - left;
      wrong += plain != dashgen::window_masked(key, row, keys_end, diagonal, left, right);
    }
  std::printf("%d %d %lld\n", reaches ? 1 : 0, any ? 1 : 0, wrong);
  return 0;
}

// argv: causal, first_key, keys, first_row, rows, keys_end, diagonal. Prints the per-task test,
// then whether any pair is masked.
int main(int argc, char** argv) {
  if (argc == 10) return window(argv);
  int a[7];
  for (int i = 0; i < 7; ++i) a[i] = std::atoi(argv[i + 1]);
  const bool causal = a[0];
  const int first_key = a[1], keys = a[2], first_row = a[3], rows = a[4];
  const int keys_end = a[5], diagonal = a[6];
  const int last_key = first_key + keys - 1;
  bool any = false;
  for (int key = first_key; key <= last_key; ++key)
    for (int row = first_row; row < first_row + rows; ++row)
      any = any || (causal ? dashgen::masked<true>(key, row, keys_end, diagonal)
                           : dashgen::masked<false>(key, row, keys_end, diagonal));
  const bool reaches = causal ? dashgen::mask_reaches<true>(last_key, first_row, keys_end, diagonal)
                              : dashgen::mask_reaches<false>(last_key, first_row, keys_end, diagonal);
  std::printf("%d %d\n", reaches ? 1 : 0, any ? 1 : 0);
  return 0;
}
"""


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found")
    out = tmp_path_factory.mktemp("mask")
    (out / "driver.cpp").write_text(DRIVER)
    subprocess.run([gxx, "-std=c++17", "-O1", "-I", str(include_dir()), str(out / "driver.cpp"),
                    "-o", str(out / "driver")], check=True)
    return out / "driver"


@settings(max_examples=300, deadline=None)
@given(causal=st.booleans(), n=st.integers(0, 40), m=st.integers(0, 40),
       half=st.integers(0, 1), block_m=st.sampled_from([64, 128]),
       end_from_last=st.integers(-70, 70), diagonal_from_last=st.integers(-200, 70))
def test_mask_reaches_exactly_the_tasks_with_a_masked_pair(driver, causal, n, m, half, block_m,
                                                            end_from_last, diagonal_from_last):
    # One MMA warpgroup's 64 keys of KV tile n (128 keys), the rows of Q tile m; the sequence's
    # end and the diagonal drawn near the task's last key, where the two answers part.
    first_key, first_row = 128 * n + 64 * half, block_m * m
    last_key = first_key + 63
    keys_end = max(1, last_key + end_from_last)
    diagonal = last_key - first_row + diagonal_from_last
    args = [int(causal), first_key, 64, first_row, block_m, keys_end, diagonal]
    out = subprocess.run([str(driver), *map(str, args)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == out[1], (args, out)


def test_the_driver_sees_both_answers(driver):
    run = lambda *a: subprocess.run([str(driver), *map(str, a)], capture_output=True,  # noqa: E731
                                    text=True, check=True).stdout.split()
    assert run(1, 0, 64, 128, 128, 1000, 0) == ["0", "0"]  # keys 0-63 before rows 128-255
    assert run(1, 128, 64, 0, 128, 1000, 0) == ["1", "1"]  # key 191 after row 0
    assert run(0, 960, 64, 0, 128, 1000, 0) == ["1", "1"]  # keys past the end, full mask


@settings(max_examples=300, deadline=None)
@given(n=st.integers(0, 40), m=st.integers(0, 40), half=st.integers(0, 1),
       block_m=st.sampled_from([64, 128]), end_from_last=st.integers(-70, 70),
       diagonal_from_last=st.integers(-300, 300), left=st.integers(0, 400),
       right=st.integers(0, 400), unbounded=st.sampled_from(["", "left", "right"]))
def test_window_reaches_exactly_the_tasks_with_a_masked_pair(driver, n, m, half, block_m,
                                                              end_from_last, diagonal_from_last,
                                                              left, right, unbounded):
    """A sliding window's per-task test (window_reaches) against every pair (window_masked),
    an open side held as Mask.UNBOUNDED, as the kernels get it."""
    from dashgen.schedule.problem import Mask
    first_key, first_row = 128 * n + 64 * half, block_m * m
    last_key = first_key + 63
    keys_end = max(1, last_key + end_from_last)
    diagonal = last_key - first_row + diagonal_from_last
    left, right = Mask(None if unbounded == "left" else left,
                       None if unbounded == "right" else right).kernel_bounds()
    args = ["window", first_key, 64, first_row, block_m, keys_end, diagonal, left, right]
    out = subprocess.run([str(driver), *map(str, args)], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == out[1], (args, out)
    assert out[2] == "0", (args, out)
    if unbounded == "":
        # The window in Python: the pairs it keeps, as Problem reads a mask.
        kept_all = all(key < keys_end and row + diagonal - left <= key <= row + diagonal + right
                       for key in range(first_key, last_key + 1)
                       for row in range(first_row, first_row + block_m))
        assert out[1] == ("0" if kept_all else "1")
