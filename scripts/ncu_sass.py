"""Where a backward's main kernel waits, from Nsight Compute's warp-stall sampling: the stall
reasons side by side (from `ncu --page raw --csv`: the smsp__pcsamp_warps_issue_stalled_*
totals), then per kernel the samples by SASS opcode, the instructions that hold the most
samples and the task loop (the instructions run once a task in every MMA warp: its samples by
opcode, its waits and barriers in program order, and its samples by stretch, each stretch
running from one wait to the next) and its samples by how often the code ran (a forward's
once-a-tile code in loop iterations), from `ncu --page source --csv --print-source sass`. The
detail and SpeedOfLight tables of scripts/ncu_compare.py say how busy a kernel is; these say on
which instructions its warps sit, which is what tells a barrier wait from a scoreboard or a
tensor-core wait.

python3 scripts/ncu_sass.py LABEL=PREFIX [LABEL=PREFIX ...]

PREFIX names PREFIX.sass.csv and PREFIX.raw.csv, as scripts/ncu_stalls.sh writes them.
"""
from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass, field
from pathlib import Path

from ncu_compare import number  # scripts/ is on the path when a script runs

STALL = "smsp__pcsamp_warps_issue_stalled_"
SAMPLES = "warp stall sampling (all"
TOP_REASONS, TOP_OPCODES, TOP_INSTRUCTIONS, TOP_STALL_COLUMNS, SASS_WIDTH = 15, 20, 25, 8, 70


@dataclass
class Instruction:
    address: str
    sass: str
    executed: float
    samples: float
    stalls: dict[str, float] = field(default_factory=dict)


def _rows(path: Path) -> list[list[str]]:
    if not path.is_file():
        raise SystemExit(f"{path}: no such file")
    with path.open(newline="") as f:
        return [r for r in csv.reader(f) if r and not r[0].startswith("==")]


def mnemonic(sass: str) -> str:
    """The instruction word without its predicate: `@!P1 MUFU.EX2 R1, R2` -> MUFU.EX2."""
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else "?"


def opcode(sass: str) -> str:
    """The mnemonic without its modifiers: `@!P1 HGMMA.64x128x16.F32` -> HGMMA."""
    return mnemonic(sass).split(".")[0]


def raw_stalls(path: Path) -> tuple[str, dict[str, float]]:
    """(kernel name, stall reason -> samples) of the first kernel of a raw-page CSV; the
    _not_issued metrics are a subset of their reason, so they are left out of the total."""
    rows = _rows(path)
    at = next((i for i, r in enumerate(rows) if any(c.startswith(STALL) for c in r)), None)
    if at is None:
        raise SystemExit(f"{path}: no header with {STALL}* metrics (ncu --page raw --csv)")
    header = rows[at]
    cols = {c[len(STALL):]: j for j, c in enumerate(header)
            if c.startswith(STALL) and not c.endswith("_not_issued")}
    name_col = header.index("Kernel Name") if "Kernel Name" in header else None
    for row in rows[at + 1:]:  # the units row has no numbers in these columns
        values = {k: number(row[j]) if j < len(row) else None for k, j in cols.items()}
        if any(v is not None for v in values.values()):
            name = row[name_col] if name_col is not None and name_col < len(row) else "?"
            return name, {k: v or 0.0 for k, v in values.items()}
    raise SystemExit(f"{path}: a header but no kernel row with {STALL}* values")


def _source_columns(row: list[str]) -> dict | None:
    """Column indices of a source-page header row, None for any other row."""
    lower = [c.strip().lower() for c in row]
    address = lower.index("address") if "address" in lower else next(
        (j for j, c in enumerate(lower) if "address" in c), None)
    if address is None or "source" not in lower:
        return None
    return {"address": address, "source": lower.index("source"),
            "samples": next((j for j, c in enumerate(lower) if c.startswith(SAMPLES)), None),
            "executed": next((j for j, c in enumerate(lower)
                              if c.startswith("instructions executed")), None),
            "stalls": {row[j].strip(): j for j, c in enumerate(lower)
                       if "stall" in c and "warp stall sampling" not in c}}


def sass_rows(path: Path) -> list[Instruction]:
    """Every instruction row of a source-page CSV; when ncu prints several functions, each
    under its own name line and header, all their rows."""
    cols, out = None, []
    for row in _rows(path):
        found = _source_columns(row)
        if found is not None:
            if found["samples"] is None:
                raise SystemExit(f"{path}: no 'Warp Stall Sampling (All Samples)' column "
                                 "(was the SourceCounters section collected?)")
            cols = found
            continue
        if cols is None or len(row) <= max(cols["address"], cols["source"], cols["samples"]):
            continue
        if not row[cols["address"]].strip():
            continue
        out.append(Instruction(row[cols["address"]].strip(), row[cols["source"]].strip(),
                               _value(row, cols["executed"]), _value(row, cols["samples"]),
                               {k: _value(row, j) for k, j in cols["stalls"].items()}))
    if cols is None:
        raise SystemExit(f"{path}: no header with an Address and a Source column "
                         "(ncu --page source --csv --print-source sass)")
    return out


def _value(row: list[str], j: int | None) -> float:
    return (number(row[j]) or 0.0) if j is not None and j < len(row) else 0.0


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}" if whole else "0.0"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def stall_table(reports: dict[str, dict[str, float]]) -> list[str]:
    """Each reason's share of its kernel's samples, by the first label's share."""
    labels = list(reports)
    totals = {label: sum(reports[label].values()) for label in labels}
    first = reports[labels[0]]
    reasons = sorted({r for s in reports.values() for r in s},
                     key=lambda r: (-first.get(r, 0.0), r))[:TOP_REASONS]
    lines = ["| stall reason (% of samples) | " + " | ".join(labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for r in reasons:
        cells = [_pct(reports[label][r], totals[label]) if r in reports[label] else "-"
                 for label in labels]
        lines.append(f"| {r} | " + " | ".join(cells) + " |")
    return lines


def opcode_table(rows: list[Instruction]) -> list[str]:
    executed: dict[str, float] = {}
    samples: dict[str, float] = {}
    for ins in rows:
        op = opcode(ins.sass)
        executed[op] = executed.get(op, 0.0) + ins.executed
        samples[op] = samples.get(op, 0.0) + ins.samples
    total = sum(samples.values())
    lines = ["| opcode | instructions executed | samples | % of samples |", "|---|---:|---:|---:|"]
    for op in sorted(samples, key=lambda o: (-samples[o], o))[:TOP_OPCODES]:
        lines.append(f"| {op} | {executed[op]:,.0f} | {samples[op]:,.0f} | "
                     f"{_pct(samples[op], total)} |")
    return lines


def hot_table(rows: list[Instruction]) -> list[str]:
    """The instructions with the most samples, with the per-reason columns that hold the most
    of their samples (a source page can have dozens)."""
    total = sum(ins.samples for ins in rows)
    hot = sorted(rows, key=lambda i: -i.samples)[:TOP_INSTRUCTIONS]
    sums = {k: sum(ins.stalls.get(k, 0.0) for ins in hot) for ins in hot for k in ins.stalls}
    stalls = sorted((k for k, v in sums.items() if v),
                    key=lambda k: (-sums[k], k))[:TOP_STALL_COLUMNS]
    lines = ["| address | SASS | samples | % of samples | " + "".join(f"{k} | " for k in stalls),
             "|---|---|---:|---:|" + "---:|" * len(stalls)]
    for ins in hot:
        cells = "".join(f"{ins.stalls.get(k, 0.0):,.0f} | " for k in stalls)
        lines.append(f"| {ins.address} | {_cell(ins.sass[:SASS_WIDTH])} | {ins.samples:,.0f} | "
                     f"{_pct(ins.samples, total)} | {cells}")
    return [line.rstrip() for line in lines]


def _stall_sums(instructions: list[Instruction]) -> dict[str, float]:
    sums: dict[str, float] = {}
    for ins in instructions:
        for reason, v in ins.stalls.items():
            sums[reason] = sums.get(reason, 0.0) + v
    return sums


def _top_stalls(stalls: dict[str, float], whole: float, n: int) -> str:
    """The n reasons with the most samples, as % of `whole` ("-" for none); the (Not Issued)
    columns are a subset of their reason and are left out."""
    issued = {k: v for k, v in stalls.items() if v and "not issued" not in k.lower()}
    return ", ".join(f"{k} {_pct(v, whole)}" for k, v in
                     sorted(issued.items(), key=lambda kv: (-kv[1], kv[0]))[:n]) or "-"


# What marks a region's code: the MMA warpgroups issue the wgmmas, the producer the TMA loads,
# the dQ writer the bulk reduce-adds.
MARKERS = (("HGMMA", "wgmma"), ("UTMALDG", "TMA loads"), ("UBLKRED", "bulk reduce"))


def region_table(rows: list[Instruction]) -> list[str]:
    """Samples per stretch of code ending in an EXIT. The warp roles branch apart at the top and
    each ends in its own EXIT, so the stretches tell the roles apart by what they issue; the
    code after the last EXIT is out-of-line (the retry loops of barrier waits, jumped to from
    any role) and is its own row."""
    regions: list[list[Instruction]] = [[]]
    for ins in rows:
        regions[-1].append(ins)
        if opcode(ins.sass) == "EXIT":
            regions.append([])
    regions = [r for r in regions if r]
    total = sum(ins.samples for ins in rows)
    lines = ["| code | instructions | issues | % of samples | top stalls (% of the region's) |",
             "|---|---:|---|---:|---|"]
    for region in regions:
        samples = sum(ins.samples for ins in region)
        marks = ", ".join(name for op, name in MARKERS
                          if any(opcode(ins.sass) == op for ins in region)) or "-"
        top = _top_stalls(_stall_sums(region), samples, 3)
        ends = "EXIT" if opcode(region[-1].sass) == "EXIT" else "out-of-line, after the last EXIT"
        lines.append(f"| {region[0].address}..{region[-1].address} ({ends}) | {len(region)} | "
                     f"{marks} | {_pct(samples, total)} | {top} |")
    return lines


# The task loop: the instructions run about as often as the wgmmas (within LOOP_SPREAD of their
# count), i.e. once a task in every MMA warp, on the path most tasks take. Its waits and barriers
# are listed in program order with the instructions that hold LOOP_HOT_SHARE of its samples (a
# barrier's wait is sampled on the instruction after it).
LOOP_SPREAD, LOOP_HOT_SHARE = 0.1, 0.01
LOOP_WAITS = ("WARPGROUP", "BAR", "SYNCS", "FENCE", "MEMBAR")


def loop_rows(rows: list[Instruction]) -> tuple[float, list[Instruction]]:
    """(runs, instructions) of the task loop: runs is the wgmmas' execution count with the most
    executions in all (a kernel's other wgmma paths, such as its masked tasks', run less)."""
    counts: dict[float, float] = {}
    for ins in rows:
        if opcode(ins.sass) == "HGMMA" and ins.executed:
            counts[ins.executed] = counts.get(ins.executed, 0.0) + ins.executed
    if not counts:
        return 0.0, []
    runs = max(counts, key=lambda c: (counts[c], c))
    return runs, [ins for ins in rows if abs(ins.executed - runs) <= LOOP_SPREAD * runs]


def loop_tables(rows: list[Instruction]) -> list[str]:
    """The task loop's size and samples, its samples by opcode, and its waits in order."""
    runs, loop = loop_rows(rows)
    if not loop:
        return ["No wgmma in this kernel: no task loop."]
    total = sum(ins.samples for ins in rows)
    samples = sum(ins.samples for ins in loop)
    out = [f"{len(loop)} instructions run {runs:,.0f} times (a task, per MMA warp), "
           f"{samples:,.0f} samples ({_pct(samples, total)}% of the kernel's).", "",
           "| opcode | instructions | samples | % of the loop's | top stalls (% of the opcode's) |",
           "|---|---:|---:|---:|---|"]
    by_op: dict[str, list[Instruction]] = {}
    for ins in loop:
        by_op.setdefault(opcode(ins.sass), []).append(ins)
    for op, group in sorted(by_op.items(), key=lambda kv: (-sum(i.samples for i in kv[1]),
                                                           kv[0]))[:TOP_OPCODES]:
        op_samples = sum(i.samples for i in group)
        out.append(f"| {op} | {len(group)} | {op_samples:,.0f} | {_pct(op_samples, samples)} | "
                   f"{_top_stalls(_stall_sums(group), op_samples, 3)} |")
    out += ["", "| address | SASS | samples | % of the loop's | top stalls (% of its) |",
            "|---|---|---:|---:|---|"]
    for ins in loop:
        if opcode(ins.sass) in LOOP_WAITS or ins.samples >= LOOP_HOT_SHARE * samples:
            out.append(f"| {ins.address} | {_cell(ins.sass[:SASS_WIDTH])} | {ins.samples:,.0f} | "
                       f"{_pct(ins.samples, samples)} | {_top_stalls(ins.stalls, ins.samples, 2)} |")
    return out


RUNS_ROWS = 12


def runs_table(rows: list[Instruction]) -> list[str]:
    """Samples by how often the code ran: the instructions grouped by their execution count (a
    count is a basic block or blocks that run together), the groups with the most samples, each
    with its count against the task loop's and its samples a run against the loop's. Code run
    once a query tile in a forward (its prologue and epilogue, a tile's last step) then reads as
    loop iterations: a group whose runs are 1/7 of the loop's and whose samples a run are 2.5x
    the loop's holds 2.5 steps of a tile's time. The counts are warp executions, so a role with
    fewer warps (a writer or producer warp) runs fewer times on the same tasks."""
    loop_runs, loop = loop_rows(rows)
    if not loop:
        return ["No wgmma in this kernel: no task loop."]
    per_loop_run = sum(ins.samples for ins in loop) / loop_runs
    groups: dict[float, list[Instruction]] = {}
    for ins in rows:
        if ins.executed:
            groups.setdefault(ins.executed, []).append(ins)
    total = sum(ins.samples for ins in rows)
    out = ["| runs | / the loop's | instructions | wgmmas | exponentials | samples | % of samples "
           "| samples a run / the loop's |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    samples = {runs: sum(i.samples for i in group) for runs, group in groups.items()}
    for runs in sorted(groups, key=lambda r: -samples[r])[:RUNS_ROWS]:
        group, part = groups[runs], samples[runs]
        wgmmas = sum(1 for i in group if opcode(i.sass) == "HGMMA")
        exps = sum(1 for i in group if mnemonic(i.sass) == "MUFU.EX2")
        cost = part / runs / per_loop_run if per_loop_run else 0.0
        out.append(f"| {runs:,.0f} | {runs / loop_runs:.3f} | {len(group)} | {wgmmas} | {exps} | "
                   f"{part:,.0f} | {_pct(part, total)} | {cost:.3f} |")
    return out


def is_wait(sass: str) -> bool:
    """A wait on another party that opens a stretch of the task loop: a wgmma wait
    (WARPGROUP.DEPBAR), a named-barrier sync (BAR.SYNC; a barrier's samples land on the
    instruction after it, in the same stretch) or an mbarrier try-wait (SYNCS...TRYWAIT, whose
    retry branch follows it)."""
    op = opcode(sass)
    return ((op == "WARPGROUP" and "DEPBAR" in sass) or (op == "BAR" and ".SYNC" in sass)
            or (op == "SYNCS" and "TRYWAIT" in sass))


def stretch_table(rows: list[Instruction]) -> list[str]:
    """The task loop's samples by stretch: a stretch starts at a wait (is_wait) and runs to the
    next one, so its samples are the time spent at that wait and on the work after it. Side by
    side with another kernel's, this says which wait and which stretch of work a per-task
    difference sits in (multiply the share by the task's time). The exponentials column counts
    MUFU.EX2: which wait a kernel's softmax sits behind (ptxas moves them across waits; the
    source order does not say)."""
    _, loop = loop_rows(rows)
    if not loop:
        return ["No wgmma in this kernel: no task loop."]
    stretches: list[list[Instruction]] = [[]]
    for ins in loop:
        if is_wait(ins.sass) and stretches[-1]:
            stretches.append([])
        stretches[-1].append(ins)
    samples = sum(ins.samples for ins in loop)
    out = ["| from | opening instruction | instructions | wgmmas | exponentials | samples | "
           "% of the loop's | top stalls (% of the stretch's) |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    for group in stretches:
        head = group[0]
        part = sum(i.samples for i in group)
        wgmmas = sum(1 for i in group if opcode(i.sass) == "HGMMA")
        exps = sum(1 for i in group if mnemonic(i.sass) == "MUFU.EX2")
        out.append(f"| {head.address} | {_cell(head.sass[:SASS_WIDTH])} | {len(group)} | "
                   f"{wgmmas} | {exps} | {part:,.0f} | {_pct(part, samples)} | "
                   f"{_top_stalls(_stall_sums(group), part, 3)} |")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", metavar="LABEL=PREFIX")
    args = ap.parse_args(argv)
    prefixes: dict[str, str] = {}
    for item in args.reports:
        label, sep, prefix = item.partition("=")
        if not sep or not label or not prefix:
            ap.error(f"reports: expected LABEL=PREFIX, got {item!r}")
        if label in prefixes:
            ap.error(f"reports: label {label!r} given twice")
        prefixes[label] = prefix
    stalls, sass, out = {}, {}, []
    for label, prefix in prefixes.items():
        name, stalls[label] = raw_stalls(Path(prefix + ".raw.csv"))
        sass[label] = sass_rows(Path(prefix + ".sass.csv"))
        samples = sum(ins.samples for ins in sass[label])
        out.append(f"{label}: `{name[:100]}`, {samples:,.0f} samples on "
                   f"{len(sass[label])} instructions")
    out += ["", "## Stall reasons", "", *stall_table(stalls)]
    for label, rows in sass.items():
        out += ["", f"## {label}: samples by code region", "", *region_table(rows),
                "", f"## {label}: samples by opcode", "", *opcode_table(rows),
                "", f"## {label}: instructions with the most samples", "", *hot_table(rows),
                "", f"## {label}: the task loop", "", *loop_tables(rows),
                "", f"## {label}: the task loop by stretch", "", *stretch_table(rows),
                "", f"## {label}: samples by how often the code ran", "", *runs_table(rows)]
    print("\n".join(out))


if __name__ == "__main__":
    main()
