"""Whether two dashgen checkouts compile to the same kernels, for a change meant to leave the
measured kernels as they are (a refactor of a template, a header moved, a comment): each tree
renders and compiles (NVRTC for sm_90a, no GPU) the golden variants
(dashgen.tools.emit.golden_variants) in a process of its own, nvdisasm lists each cubin, and
every kernel function's instructions are compared without their addresses. A function is
"same" (the same instructions in the same order), "reordered" (the same instructions, another
order: ptxas scheduled or numbered differently) or "differs", with the opcodes whose counts
moved.

python3 lab/sass_compare.py OLD_TREE NEW_TREE [--out DIR] [--only SUBSTRING]

nvdisasm: from PATH, $NVDISASM, or the nvidia-cuda-nvdisasm wheel
(`pip install nvidia-cuda-nvdisasm`).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

SECTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(.*?)\s*;?\s*$")


def opcode(sass: str) -> str:
    """The instruction word without its predicate and modifiers: `@!P1 HGMMA.64x128x16.F32`
    -> HGMMA (the counts that moved are told per opcode)."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";").split(".")[0] if words else "?"


def find_nvdisasm() -> str:
    """The nvdisasm to run: $NVDISASM, then PATH, then the nvidia-cuda-nvdisasm wheel."""
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the namespace package of NVIDIA's CUDA wheels
    except ImportError:
        nvidia = None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("cu*/bin/nvdisasm")):
            return str(candidate)
    raise SystemExit("nvdisasm not found: set NVDISASM, put it on PATH, or "
                     "pip install nvidia-cuda-nvdisasm")


def functions(listing: str) -> dict[str, list[str]]:
    """Function name -> its instructions, in order and without addresses, from `nvdisasm -c`."""
    out: dict[str, list[str]] = {}
    current = None
    for line in listing.splitlines():
        section = SECTION.match(line)
        if section:
            current = out.setdefault(section.group(1), [])
            continue
        instruction = INSTRUCTION.match(line)
        if instruction and current is not None:
            current.append(" ".join(instruction.group(1).rstrip(";").split()))
    return out


def verdict(old: list[str], new: list[str]) -> tuple[str, dict[str, int]]:
    """("same" | "reordered" | "differs", opcode -> new count - old count for those that moved)."""
    if old == new:
        return "same", {}
    if Counter(old) == Counter(new):
        return "reordered", {}
    counts_old, counts_new = Counter(map(opcode, old)), Counter(map(opcode, new))
    moved = {op: counts_new[op] - counts_old[op] for op in sorted(set(counts_old) | set(counts_new))
             if counts_new[op] != counts_old[op]}
    return "differs", moved


def list_tree(tree: str, path: str, only: str | None) -> None:
    """In a child process: compile `tree`'s golden variants and write their listings to `path`."""
    sys.path.insert(0, tree)
    import dashgen
    from dashgen.codegen.compile import compile_kernel
    from dashgen.codegen.render import render_variant
    from dashgen.tools.emit import golden_variants
    assert dashgen.__file__.startswith(tree), dashgen.__file__
    nvdisasm = find_nvdisasm()
    result = {}
    for variant in golden_variants():
        source = render_variant(variant)
        if only and only not in source.name:
            continue
        cubin = compile_kernel(source)
        with tempfile.TemporaryDirectory() as tmp:
            file = Path(tmp) / f"{source.name}.cubin"
            file.write_bytes(cubin.data)
            listing = subprocess.run([nvdisasm, "-c", str(file)], capture_output=True, text=True,
                                     check=True).stdout
        result[source.name] = functions(listing)
    Path(path).write_text(json.dumps(result))


def report(old: dict[str, dict[str, list[str]]], new: dict[str, dict[str, list[str]]]) -> str:
    rows = ["| kernel | function | instructions old / new | verdict | opcodes moved (new - old) |",
            "|---|---|---|---|---|"]
    tally = Counter()
    for kernel in sorted(set(old) | set(new)):
        funcs_old, funcs_new = old.get(kernel, {}), new.get(kernel, {})
        for function in sorted(set(funcs_old) | set(funcs_new)):
            a, b = funcs_old.get(function), funcs_new.get(function)
            if a is None or b is None:
                what, moved = ("only in new" if a is None else "only in old"), {}
            else:
                what, moved = verdict(a, b)
            tally[what] += 1
            delta = ", ".join(f"{op} {n:+d}" for op, n in moved.items())
            rows.append(f"| {kernel} | {function} | {len(a or [])} / {len(b or [])} | {what} | "
                        f"{delta} |")
    rows.append("")
    rows.append("functions: " + ", ".join(f"{n} {what}" for what, n in sorted(tally.items())))
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--out", default="sass_compare_out")
    parser.add_argument("--only", default=None, help="only kernels whose name contains this")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        list_tree(str(Path(args.child[0]).resolve()), args.child[1], args.only)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    listings = {}
    for name in ("old", "new"):
        path = out / f"sass_{name}.json"
        subprocess.run([sys.executable, __file__, args.old, args.new,
                        *(["--only", args.only] if args.only else []),
                        "--child", getattr(args, name), str(path)], check=True)
        listings[name] = json.loads(path.read_text())
    text = report(listings["old"], listings["new"])
    (out / "sass_compare.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
