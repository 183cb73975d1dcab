"""A copy of a dashgen checkout with named experiments applied to its kernel templates: each a
set of exact text substitutions, every one found as often as expected (else the patch is
refused by name: the template changed under it). For changes prepared without a GPU, and for
timing-only variants that must never enter the product; the copy is then timed and checked
beside its source (the anchor kit's bench script with the copy as the second dashgen, or
lab/compare_trees.py). Once a patch is measured and decided, it goes into the templates (with
its numbers in docs/design.md) or into lab/notes/tried-and-dropped.md, and leaves this table.

python3 lab/patched_tree.py SRC_TREE OUT_TREE --patch NAME [--patch NAME ...]
python3 lab/patched_tree.py --list

The patches:
- no-dq-traffic: the dQ writer keeps its waits, turns and buffers and sends nothing to global
  memory (neither the bulk adds nor the first store). Timing only (its dq is wrong): what the dQ
  sums' L2 traffic costs, half of a 256 task's L2 bytes (lab/notes/cluster-pair-plan.md).
- count-from-smem: the swapped mainloop (192, 256) reads the walk's task count from its
  shared-memory slot at each task's end instead of holding it across the task: ptxas spilled
  that word at 192 (NVRTC 13: the named 192/192 variants 32 -> 0 bytes).
- own-pieces: at 192 warpgroup 1 computes its one dQ piece once; today it computes it twice so
  that both warpgroups issue the same wgmmas (a wgmma on a path one warpgroup skips was
  serialized by ptxas when that was written; NVRTC 13 compiles the branch without C7511).
  Same adds, same bits; 6 fewer wgmmas a task in warpgroup 1.
- gqa-lane-base: the swapped epilogue's GQA adds of dK^T/dV^T from one base address a lane,
  each pair's add at a constant offset from it; ptxas held each add's own 64-bit address
  across the adds (NVRTC 13, 192 GQA: 236-240 -> 32 bytes of spills, 2,920 -> 2,552
  instructions in the causal symshift kernel). Same adds in the same order: same bits.
- rows-uniform-descriptors: the rows mainloop (64, 128) takes the swapped one's descriptors
  (docs/design.md, `uniform-descriptors`): each tile's low word broadcast once, a uniform add a
  k16 step (S^T/dP^T, dV/dK's B, dQ). Same descriptors: same bits. Changes the golden kernels:
  for timing at 64/128, where the long rows lose to FA3/FA4.
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

WRITER = "templates/include/dashgen/attn/bwd_dq_writer.cuh"
SWAPPED = "templates/include/dashgen/attn/bwd_mainloop_swapped.cuh"
EPILOGUE = "templates/include/dashgen/attn/bwd_epilogue_swapped.cuh"
ROWS = "templates/include/dashgen/attn/bwd_mainloop.cuh"


@dataclass(frozen=True)
class Edit:
    """In `path`, `old` (found exactly `count` times) becomes `new`."""

    path: str
    old: str
    new: str
    count: int = 1


NO_SEND = "// lab/patched_tree.py no-dq-traffic: nothing to global memory"

PATCHES: dict[str, tuple[Edit, ...]] = {
    "no-dq-traffic": (
        Edit(WRITER, "      bulk_store_f32(dst, src, K::kDqBytes);\n",
             f"      (void)dst; (void)src;  {NO_SEND}\n"),
        Edit(WRITER, "      bulk_reduce_add_f32(dst, src, K::kDqBytes);\n",
             f"      (void)dst; (void)src;  {NO_SEND}\n"),
        Edit(WRITER, "        bulk_store_f32(piece, src, K::kDqBytes);"
                     "  // the first contribution (see land_partial)\n",
             f"        (void)piece; (void)src;  {NO_SEND}\n"),
        Edit(WRITER, "        bulk_reduce_add_f32(piece, src, K::kDqBytes);\n",
             f"        (void)piece; (void)src;  {NO_SEND}\n"),
    ),
    "count-from-smem": (
        Edit(SWAPPED, "    for (int i = begin; i < end; ++i) {\n",
             "    for (int i = begin; i < begin + task_count(smem); ++i) {\n"),
        Edit(SWAPPED, "  // Stages 5 and 6: dQ's first piece",
             "  // The walk's task count, read again at each task's end (lab/patched_tree.py).\n"
             "  __device__ static __forceinline__ int task_count(const char* smem) {\n"
             "    int count;\n"
             "    asm volatile(\"ld.shared.b32 %0, [%1];\" : \"=r\"(count)\n"
             "                 : \"r\"(shared_address(smem + K::kOffCount)));\n"
             "    return count;\n"
             "  }\n\n"
             "  // Stages 5 and 6: dQ's first piece"),
    ),
    "own-pieces": (
        Edit(SWAPPED, "      dq_mma(dq, smem, first + (b < pieces ? b : pieces - 1));\n",
             "      if (b < pieces) dq_mma(dq, smem, first + b);\n"),
    ),
    "rows-uniform-descriptors": (
        Edit(ROWS,
             "    wgmma_fence();\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kScoreSteps; ++k) {\n"
             "      wgmma_ss<kIn, kBlockM>(st, tile_desc_k_major(smem + kOffK, kBlockN, 64 * wg, k),\n"
             "                             tile_desc_k_major(q_tile, kBlockM, 0, k), k > 0);\n"
             "    }\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kScoreSteps; ++k) {\n"
             "      wgmma_ss<kIn, kBlockM>(dpt, tile_desc_k_major(smem + kOffV, kBlockN, 64 * wg, k),\n"
             "                             tile_desc_k_major(do_tile, kBlockM, 0, k), k > 0);\n"
             "    }\n",
             "    wgmma_fence();  // lab/patched_tree.py rows-uniform-descriptors\n"
             "    const u32 k_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(smem + kOffK + 64 * wg * 128));\n"
             "    const u32 q_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(q_tile));\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kScoreSteps; ++k) {\n"
             "      wgmma_ss<kIn, kBlockM>(st, k_major_step<kBlockN>(k_lo, k), k_major_step<kBlockM>(q_lo, k),\n"
             "                             k > 0);\n"
             "    }\n"
             "    const u32 v_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(smem + kOffV + 64 * wg * 128));\n"
             "    const u32 do_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(do_tile));\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kScoreSteps; ++k) {\n"
             "      wgmma_ss<kIn, kBlockM>(dpt, k_major_step<kBlockN>(v_lo, k), k_major_step<kBlockM>(do_lo, k),\n"
             "                             k > 0);\n"
             "    }\n"),
        Edit(ROWS,
             "    const u64 b_desc = wgmma_desc_mn_major_sw128(b_tile, kBlockM * 128);\n"
             "#pragma unroll\n"
             "    for (int kk = 0; kk < kBlockM / 16; ++kk) {\n"
             "      rs_mma(acc, a[kk], wgmma_desc_advance(b_desc, kk * kSw128MnMajorKStepBytes));\n",
             "    const u32 b_lo = uniform_desc_lo(wgmma_desc_mn_major_sw128(b_tile, kBlockM * 128));\n"
             "#pragma unroll\n"
             "    for (int kk = 0; kk < kBlockM / 16; ++kk) {\n"
             "      rs_mma(acc, a[kk], desc_from_lo(b_lo, kk * kSw128MnMajorKStepBytes));\n"),
        Edit(ROWS,
             "    const u64 k_desc = wgmma_desc_mn_major_sw128(k_block, kBlockN * 128);\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kDqSteps; ++k) {\n"
             "      const u64 a_ds = tile_desc_k_major(ds_tile, kBlockM, a_row0, k);\n"
             "      wgmma_ss<kIn, 64, 0, 1>(dq, a_ds, wgmma_desc_advance(k_desc, k * kSw128MnMajorKStepBytes),\n",
             "    const u32 k_lo = uniform_desc_lo(wgmma_desc_mn_major_sw128(k_block, kBlockN * 128));\n"
             "    const u32 ds_lo = uniform_desc_lo(wgmma_desc_k_major_sw128(ds_tile + a_row0 * 128));\n"
             "#pragma unroll\n"
             "    for (int k = 0; k < kDqSteps; ++k) {\n"
             "      const u64 a_ds = k_major_step<kBlockM>(ds_lo, k);\n"
             "      wgmma_ss<kIn, 64, 0, 1>(dq, a_ds, desc_from_lo(k_lo, k * kSw128MnMajorKStepBytes),\n"),
    ),
    "gqa-lane-base": (
        Edit(EPILOGUE,
             "    float* dk_acc = p.dk_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim;\n"
             "    float* dv_acc = p.dv_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim;\n"
             "    pairs(dkt, me, [&](int key, int col, float lo, float hi) {\n"
             "      red_add_v2_f32(dk_acc + key * kHeadDim + col, lo, hi);\n"
             "    });\n"
             "    pairs(dvt, me, [&](int key, int col, float lo, float hi) {\n"
             "      red_add_v2_f32(dv_acc + key * kHeadDim + col, lo, hi);\n"
             "    });\n",
             "    const bool odd = me.g & 1;  // lab/patched_tree.py gqa-lane-base\n"
             "    const int lane_off = (2 * me.t4 + (odd ? 1 : 0)) * kHeadDim + 16 * me.warp + (me.g & ~1);\n"
             "    float* dk_acc = p.dk_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim + lane_off;\n"
             "    float* dv_acc = p.dv_accum + (tile + (kSplit ? 0 : kKeys * me.wg)) * kHeadDim + lane_off;\n"
             "    const int lane_key = 2 * me.t4 + (odd ? 1 : 0);\n"
             "    const int lane_col = 16 * me.warp + (me.g & ~1);\n"
             "    pairs(dkt, me, [&](int key, int col, float lo, float hi) {\n"
             "      red_add_v2_f32(dk_acc + ((key - lane_key) * kHeadDim + (col - lane_col)), lo, hi);\n"
             "    });\n"
             "    pairs(dvt, me, [&](int key, int col, float lo, float hi) {\n"
             "      red_add_v2_f32(dv_acc + ((key - lane_key) * kHeadDim + (col - lane_col)), lo, hi);\n"
             "    });\n"),
    ),
}


def apply(text: str, path: str, edits: tuple[Edit, ...], name: str) -> str:
    """`text` (the file at `path`) with `name`'s edits to that file applied."""
    for edit in edits:
        if edit.path != path:
            continue
        found = text.count(edit.old)
        if found != edit.count:
            raise ValueError(f"patch {name}: {path}: expected {edit.count} of "
                             f"{edit.old.strip()[:60]!r}, found {found}; the template changed")
        text = text.replace(edit.old, edit.new)
    return text


def make_tree(src: Path, out: Path, names: list[str]) -> None:
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f"unknown patch(es) {', '.join(unknown)}; known: {', '.join(PATCHES)}")
    if out.exists():
        raise ValueError(f"{out} exists; give a new folder")
    out.mkdir(parents=True)
    for part in ("dashgen", "templates", "pyproject.toml"):
        source = src / part
        if source.is_dir():
            # symlinks kept: dashgen/templates links to the tree's templates/, which the
            # patches edit (followed, the package would carry an unpatched copy).
            shutil.copytree(source, out / part, symlinks=True)
        else:
            shutil.copy2(source, out / part)
    for name in names:
        for path in sorted({e.path for e in PATCHES[name]}):
            file = out / path
            file.write_text(apply(file.read_text(), path, PATCHES[name], name))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, nargs="?", help="the checkout to copy")
    parser.add_argument("out", type=Path, nargs="?", help="a new folder for the copy")
    parser.add_argument("--patch", action="append", default=[], metavar="NAME",
                        help=f"one of {', '.join(PATCHES)} (repeatable)")
    parser.add_argument("--list", action="store_true", help="name the patches and stop")
    args = parser.parse_args()
    if args.list:
        print("\n".join(PATCHES))
        return
    if args.src is None or args.out is None or not args.patch:
        parser.error("SRC_TREE, OUT_TREE and at least one --patch are needed")
    try:
        make_tree(args.src, args.out, args.patch)
    except ValueError as error:
        parser.error(str(error))
    print(f"{args.out}: {args.src} with {', '.join(args.patch)}")


if __name__ == "__main__":
    main()
