"""The persistent forward's tile order, from the kernel's own code: the header that tells each
CTA its i-th query tile (templates/include/dashgen/attn/fwd_tile_order.cuh, included by
fwd_sm90_persistent.cuh) compiled as host code with g++, walked on the grids
runtime.forward.forward_ctas launches. Every query tile once; under a causal mask in pairs of
equal cost dealt round-robin, every CTA within one pair of the others; under a full mask tile t
of the m-fastest order on CTA t mod grid."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from dashgen.codegen.render import include_dir

torch = pytest.importorskip("torch")  # runtime.forward imports torch

from dashgen.runtime.forward import forward_ctas  # noqa: E402

HEADER = "dashgen/attn/fwd_tile_order.cuh"
KERNEL_HEADER = "dashgen/attn/fwd_sm90_persistent.cuh"
# The walk over every CTA's tiles; __host__ and __device__ mean nothing to g++.
DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include "dashgen/attn/fwd_tile_order.cuh"

// The fields of FwdParams the order reads, and the grid as the kernel's builtins give it.
struct Params {
  int batch, heads_q, seqlen_q;
};
struct Grid {
  unsigned cta_index, ctas;
  unsigned cta() const { return cta_index; }
  unsigned num_ctas() const { return ctas; }
};

template <bool kCausal>
static void walk(int num_m, int heads_q, int batch, int ctas) {
  constexpr int kBlockM = 128;
  const Params p{batch, heads_q, num_m * kBlockM - 1};  // a partial last tile counts as one
  for (int cta = 0; cta < ctas; ++cta) {
    std::printf("cta");
    for (int i = 0;; ++i) {
      const dashgen::FwdTile t = dashgen::fwd_persistent_tile<kCausal, kBlockM>(
          p, Grid{static_cast<unsigned>(cta), static_cast<unsigned>(ctas)}, i);
      if (t.m < 0) break;
      std::printf(" %d,%d,%d", t.b, t.h, t.m);
    }
    std::printf("\n");
  }
}

int main(int argc, char** argv) {
  if (argc != 6) return 2;
  const int num_m = std::atoi(argv[2]), heads_q = std::atoi(argv[3]);
  const int batch = std::atoi(argv[4]), ctas = std::atoi(argv[5]);
  if (std::atoi(argv[1])) walk<true>(num_m, heads_q, batch, ctas);
  else walk<false>(num_m, heads_q, batch, ctas);
  return 0;
}
"""

needs_header = pytest.mark.skipif(
    not (include_dir() / HEADER).is_file() or shutil.which("g++") is None,
    reason=f"needs g++ and templates/include/{HEADER} (the persistent forward's tile order as "
           f"host-compilable code)")


@pytest.fixture(scope="module")
def tile_order(tmp_path_factory):
    """tiles(causal, num_m, heads_q, batch, ctas) -> per CTA its (batch, head, m) tiles, in the
    order the kernel's header gives them."""
    folder = tmp_path_factory.mktemp("tile_order")
    (folder / "walk.cpp").write_text(DRIVER)
    binary = folder / "walk"
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-Wall", "-Werror", "-D__host__=",
                           "-D__device__=", f"-I{include_dir()}", str(folder / "walk.cpp"),
                           "-o", str(binary)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{HEADER} does not compile as host code:\n{proc.stderr}"

    def tiles(causal, num_m, heads_q, batch, ctas):
        out = subprocess.run([str(binary), str(int(causal)), str(num_m), str(heads_q),
                              str(batch), str(ctas)], capture_output=True, text=True,
                             timeout=60, check=True).stdout
        return [[tuple(map(int, t.split(","))) for t in line.split()[1:]]
                for line in out.splitlines()]
    return tiles


@needs_header
def test_the_kernel_takes_its_order_from_the_header():
    text = (include_dir() / KERNEL_HEADER).read_text()
    assert f'#include "{HEADER}"' in text
    assert "fwd_persistent_tile<kCausal, kBlockM>(" in text


# (query tiles a head, query heads, batch): the benchmark's head_dim 64 shapes 1k .. 16k and
# head_dim 128's 1k and 16k, then odd ones (3,000 and 12,800 tokens among them).
SHAPES = [(8, 32, 16), (16, 32, 8), (32, 32, 4), (64, 32, 2), (128, 32, 1),
          (8, 16, 16), (128, 16, 1),
          (5, 3, 1), (7, 8, 5), (132, 1, 1), (1, 1000, 1), (3, 5, 7),
          (127, 3, 1), (24, 32, 1), (100, 32, 1)]


def units_of(per_cta):
    """A CTA's tiles cut into the units the causal order deals: two tiles of cost num_m + 1 KV
    tiles together (num_m - 1 - j then j of one head, or two heads' middle tiles), or one last
    middle tile alone."""
    return [per_cta[i:i + 2] for i in range(0, len(per_cta), 2)]


@needs_header
@pytest.mark.parametrize("num_m, heads_q, batch", SHAPES)
def test_causal_every_tile_once_in_units_of_equal_cost(tile_order, num_m, heads_q, batch):
    heads = heads_q * batch
    ctas = forward_ctas(num_m, heads, 132, causal=True)
    units = -(-num_m * heads // 2)
    assert 0 < ctas <= min(132, units)
    order = tile_order(True, num_m, heads_q, batch, ctas)
    assert len(order) == ctas
    tiles = [t for per_cta in order for t in per_cta]
    assert sorted(tiles) == [(b, h, m) for b in range(batch) for h in range(heads_q)
                             for m in range(num_m)]
    lone = []
    for per_cta in order:
        for unit in units_of(per_cta):
            if len(unit) == 1:
                lone.append(unit[0])
                continue
            (b0, h0, m0), (b1, h1, m1) = unit
            assert m0 + m1 == num_m - 1 and m0 >= m1, unit  # the long tile first
            if m0 == m1:  # two heads' middle tiles
                assert (b0, h0) != (b1, h1)
            else:
                assert (b0, h0) == (b1, h1)
    # Only an odd head count under an odd num_m leaves one middle tile alone, the last head's.
    assert lone == ([(batch - 1, heads_q - 1, num_m // 2)] if num_m * heads % 2 else [])
    # Every CTA carries as many units as any other or one fewer, so its KV tiles (tile m visits
    # m + 1, square tiles) are within one unit of every other's.
    counts = [len(units_of(per_cta)) for per_cta in order]
    assert max(counts) - min(counts) <= 1 and max(counts) == -(-units // ctas)
    loads = [sum(m + 1 for _, _, m in per_cta) for per_cta in order]
    assert max(loads) <= -(-units // ctas) * (num_m + 1)
    # Unit u on CTA u mod grid: the first units of the CTAs are the order's first ctas units,
    # so the CTAs that start together hold consecutive heads.
    heads_started = sorted({b * heads_q + h for per_cta in order
                            for b, h, _ in units_of(per_cta)[0]})
    assert heads_started == list(range(heads_started[0], heads_started[-1] + 1))
    assert heads_started[0] == 0


@needs_header
@pytest.mark.parametrize("num_m, heads_q, batch", SHAPES)
def test_full_mask_deals_the_m_fastest_order_round_robin(tile_order, num_m, heads_q, batch):
    heads = heads_q * batch
    ctas = forward_ctas(num_m, heads, 132, causal=False)
    order = tile_order(False, num_m, heads_q, batch, ctas)
    flat = [[(b * heads_q + h) * num_m + m for b, h, m in per_cta] for per_cta in order]
    assert flat == [list(range(cta, num_m * heads, ctas)) for cta in range(ctas)]


def test_full_masks_keep_the_fewest_ctas():
    assert forward_ctas(8, 512, 132, causal=False) == 128
    assert forward_ctas(3, 2, 132, causal=False) == 6
    assert forward_ctas(133, 1, 132, causal=False) == 67  # 2 tiles each either way
    assert forward_ctas(8, 512, 132, causal=True) == 128  # 2,048 pairs, 16 a CTA
    assert forward_ctas(132, 1, 132, causal=True) == 66  # 66 pairs, one a CTA
    assert forward_ctas(25, 5, 132, causal=True) == 63  # 63 units: 62 pairs and a lone tile
    assert forward_ctas(100, 32, 132, causal=True) == 124  # 1,600 pairs in 13 rounds
