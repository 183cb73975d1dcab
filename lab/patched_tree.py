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
  sums' L2 traffic costs, half of a 256 task's L2 bytes (lab/notes/tried-and-dropped.md,
  `pair-stores`).
  Measured (H100, 2026-12-07): 256 ordered 1.30-1.31x, unordered 1.17-1.18x the served kernel.
  Kept to time the dQ traffic's share again beside a kernel that changes it.
"""
from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass
from pathlib import Path

WRITER = "templates/include/dashgen/attn/bwd_dq_writer.cuh"


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
