"""A copy of a dashgen checkout whose backward sends no dQ partial to global memory: the dQ
writer keeps its waits, its turns and its buffers, and issues neither the bulk adds nor the
first store. Its dq is wrong; it is for timing only, against the tree it came from, to tell how
much of the backward's time the L2 traffic of the dQ sums costs (half of a task's L2 bytes at
head_dim 256: 64 KB of 128.5). If the 256 backward is bound by the L2 (ncu of 2026-12-07: 81%
of the L2's throughput unordered), the copy runs markedly faster; if not, about as fast
(lab/notes/cluster-pair-plan.md, which a cluster pair's gain rests on).

python3 lab/no_dq_traffic_tree.py SRC_TREE OUT_TREE

Then time both, e.g. with the anchor kit's bench script (OUT_TREE as the second dashgen), or
lab/compare_trees.py --mode time (its bits differ by construction).
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

WRITER = Path("templates/include/dashgen/attn/bwd_dq_writer.cuh")
# What the dQ writer sends to global memory (land_partial: one each; land_pieces: one each).
SENDS = {
    "      bulk_store_f32(dst, src, K::kDqBytes);\n": 1,
    "      bulk_reduce_add_f32(dst, src, K::kDqBytes);\n": 1,
    "        bulk_store_f32(piece, src, K::kDqBytes);"
    "  // the first contribution (see land_partial)\n": 1,
    "        bulk_reduce_add_f32(piece, src, K::kDqBytes);\n": 1,
}
MARK = "// lab/no_dq_traffic_tree.py: no dQ to global memory\n"


def strip_sends(text: str) -> str:
    """The writer's source without its global sends (each replaced by a no-op that keeps the
    operands used); every send found exactly as often as expected, else ValueError."""
    for line, count in SENDS.items():
        found = text.count(line)
        if found != count:
            raise ValueError(f"{WRITER}: expected {count} of {line.strip()!r}, found {found}; "
                             f"the writer changed, update SENDS")
        indent = line[:len(line) - len(line.lstrip())]
        operands = "piece" if "piece" in line else "dst"
        text = text.replace(line, f"{indent}(void){operands}; (void)src;  {MARK}")
    return text


def make_tree(src: Path, out: Path) -> None:
    if out.exists():
        raise SystemExit(f"{out} exists; give a new folder")
    out.mkdir(parents=True)
    for part in ("dashgen", "templates", "pyproject.toml"):
        source = src / part
        if source.is_dir():
            shutil.copytree(source, out / part)
        else:
            shutil.copy2(source, out / part)
    writer = out / WRITER
    writer.write_text(strip_sends(writer.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path, help="the checkout to copy")
    parser.add_argument("out", type=Path, help="a new folder for the copy")
    args = parser.parse_args()
    make_tree(args.src, args.out)
    print(f"{args.out}: the dQ writer sends nothing to global memory (timing only)")


if __name__ == "__main__":
    main()
