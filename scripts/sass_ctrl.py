"""A kernel's SASS with the control fields of each instruction's encoding: the cycles the
scheduler stalls after issuing it, its yield bit, the scoreboard its result sets (a result of
variable latency: loads, MUFU, shuffles), the scoreboard that guards its sources, the
scoreboards it waits on before issuing, and its operand-reuse flags. They sit in bits 41-61 of
the second 64-bit word of each sm_90 instruction (`nvdisasm -hex`), the layout public
reverse-engineering of Volta and later describes; the reuse flags are checked against
nvdisasm's own `.reuse` marks (tests/test_sass_ctrl.py). Where a loop's loads are issued
against their first use, and what ptxas makes each instruction wait for, read off this listing
(docs/design.md, "Open": the head_dim-64 statistics loads).

python3 scripts/sass_ctrl.py --variant "BackwardVariant('bf16', 64, False, 'shift')" \\
    [--function SUBSTRING] [--start 0x1a00 --end 0x2100] [--only LDS,MUFU]
python3 scripts/sass_ctrl.py --cubin FILE [...]

nvdisasm: as scripts/sass_compare.py finds it.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ncu_sass import mnemonic  # scripts/ is on the path when a script runs
from sass_compare import SECTION, find_nvdisasm

NO_SCOREBOARD = 7  # the 3-bit scoreboard fields' "none"
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*(0x[0-9a-f]{16})\s*\*/")
SECOND_WORD = re.compile(r"^\s*/\*\s*(0x[0-9a-f]{16})\s*\*/\s*$")


@dataclass(frozen=True)
class Control:
    stall: int          # cycles before the warp's next instruction may issue
    yield_bit: int
    write_sb: int       # scoreboard set when the result is written (NO_SCOREBOARD: none)
    read_sb: int        # scoreboard released once the sources are read (NO_SCOREBOARD: none)
    wait_mask: int      # scoreboards (bit i: scoreboard i) waited on before issue
    reuse: int          # operand-reuse flags, bit i: source operand slot i (a, b, c, d)

    def waits_on(self) -> list[int]:
        return [i for i in range(6) if self.wait_mask >> i & 1]


def decode(second_word: int) -> Control:
    """The control fields of an instruction from the second 64-bit word of its encoding."""
    return Control(stall=second_word >> 41 & 0xF, yield_bit=second_word >> 45 & 1,
                   write_sb=second_word >> 46 & 7, read_sb=second_word >> 49 & 7,
                   wait_mask=second_word >> 52 & 0x3F, reuse=second_word >> 58 & 0xF)


@dataclass(frozen=True)
class Instruction:
    function: str
    address: int
    text: str
    control: Control


def instructions(listing: str) -> list[Instruction]:
    """Every instruction of an `nvdisasm -c -hex` listing with its function and control fields."""
    out: list[Instruction] = []
    function = ""
    lines = listing.splitlines()
    for i, line in enumerate(lines):
        section = SECTION.match(line)
        if section:
            function = section.group(1)
            continue
        m = INSTRUCTION.search(line)
        if not m or i + 1 >= len(lines):
            continue
        second = SECOND_WORD.match(lines[i + 1])
        if not second:
            continue
        out.append(Instruction(function, int(m.group(1), 16), m.group(2).strip(),
                               decode(int(second.group(1), 16))))
    return out


def format_instruction(ins: Instruction) -> str:
    c = ins.control
    sb = lambda v: "-" if v == NO_SCOREBOARD else str(v)  # noqa: E731
    waits = ",".join(map(str, c.waits_on())) or "-"
    return (f"{ins.address:05x}  stall {c.stall:2d}  y{c.yield_bit}  set {sb(c.write_sb)}  "
            f"read {sb(c.read_sb)}  wait {waits:<7} {ins.text}")


def listing_of_cubin(path: str) -> str:
    return subprocess.run([find_nvdisasm(), "-c", "-hex", path], capture_output=True, text=True,
                          check=True).stdout


def cubin_of_variant(expression: str) -> bytes:
    """Render and compile (NVRTC, no GPU) the variant an expression over
    dashgen.codegen.variants names."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dashgen.codegen import variants
    from dashgen.codegen.cubins import get_or_compile
    from dashgen.codegen.render import render_variant
    variant = eval(expression, {name: getattr(variants, name) for name in dir(variants)})  # noqa: S307
    cubin, _ = get_or_compile(render_variant(variant))
    return cubin.data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--variant", help="e.g. \"BackwardVariant('bf16', 64, False, 'shift')\"")
    source.add_argument("--cubin")
    parser.add_argument("--function", help="only functions whose name contains this")
    parser.add_argument("--start", type=lambda v: int(v, 0), default=0)
    parser.add_argument("--end", type=lambda v: int(v, 0), default=None)
    parser.add_argument("--only", help="comma-separated opcode prefixes, e.g. LDS,MUFU,HGMMA")
    args = parser.parse_args()
    if args.cubin:
        listing = listing_of_cubin(args.cubin)
    else:
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin_of_variant(args.variant))
            f.flush()
            listing = listing_of_cubin(f.name)
    prefixes = tuple(p.strip() for p in args.only.split(",")) if args.only else None
    for ins in instructions(listing):
        if args.function and args.function not in ins.function:
            continue
        if ins.address < args.start or (args.end is not None and ins.address > args.end):
            continue
        if prefixes and not mnemonic(ins.text).startswith(prefixes):
            continue
        print(f"{ins.function}  {format_instruction(ins)}")


if __name__ == "__main__":
    main()
