"""Two dashgen checkouts side by side on one GPU, for changes meant to keep bits and speed:
each tree runs in its own process (both are the package `dashgen`), alternated, on the same
seeded inputs, with schedule="auto" and deterministic=True.

  --mode bits: dq, dk, dv and o of the 20 benchmark shapes hashed per run (same bits?), with
    per-call CUDA-event medians.
  --mode time: GPU time of the backward and of the no-grad forward per call, from events around
    10 back-to-back calls, median of 7 batches, on 12 of the shapes, and the backward of one
    call with its host time hidden behind a GPU sleep (its kernels alone); the table gives old /
    new (above 1: the second tree is faster), medians over the alternated runs.
  --mode fwd: the no-grad forward alone, time mode's timer, on the 20 benchmark shapes (or
    --seqlens), with o hashed per run: for a change to the forward kernels.
  --mode varlen: time mode's figures for packed batches through dashgen.attention_varlen, three
    packs of 16,384 tokens (`dashgen bench --varlen`'s log-normal document lengths, seeds 0-2)
    at head_dim 64 and 128, full and causal per document, with the bits hashed as in bits mode.

  --mode gqa: time mode's figures for grouped-query attention, 4 query heads a KV head (Llama's
    grouping) on the benchmark's 16,384 tokens at hidden 2048, 2k and 8k keys, both head_dims
    and masks, with the bits hashed as in bits mode.

  --configs d128_full ...: the bits, time, fwd and gqa modes on those configurations only;
    d96_*, d192_* and d256_* (full or causal) are there by name.

Long rows: bits and time modes carry one sequence of 131,072 and one of 1,048,576 tokens in
every configuration by default (LONG_SEQLENS), so a change cannot cost them unseen. A row past
16,384 tokens is timed as one warm call then the median of 3 (one past 5 s a call: a 1M
backward runs 10-40 s), and beside the deterministic backward the non-deterministic one, whose
ratio is the price of the order at that length (a second table).

More than one new tree (OLD NEW1 NEW2 ...) runs them all alternated in one call, each run
visiting every tree in turn, and reports one table per new tree against the old one: several
candidates measured under the same clocks, for the price of one old tree.

A tree whose run fails or takes longer than --child-timeout seconds (a kernel that hangs) is
left out of the later runs and named in the report with why; the other trees go on. Without
the old tree nothing is compared: the script stops with an error.

PYTHONPATH= python3 lab/compare_trees.py OLD_TREE NEW_TREE --mode time --runs 3 --out DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path


def measure(tree: str, mode: str, out: str, seqlens: tuple[int, ...] | None = None,
            configs: tuple[str, ...] | None = None) -> None:
    """In a child process: import dashgen from `tree` and write its figures to `out`."""
    sys.path.insert(0, tree)
    import torch
    import dashgen
    assert dashgen.__file__.startswith(tree), dashgen.__file__

    def call_ms(fn, n=25, warm=3):
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        one = s.elapsed_time(e)
        for _ in range(max(1, int(80 / max(one, 1e-3)))):  # ~80 ms: the clocks settle
            fn()
        times = []
        for _ in range(n):
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    def batch_ms(fn, calls=10, batches=7):
        for _ in range(3):
            fn()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        times = []
        for _ in range(batches + 1):
            s.record()
            for _ in range(calls):
                fn()
            e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / calls)
        return statistics.median(times[1:])

    def long_ms(fn):
        """A long row: one warm call, then the median of 3 single calls (1 past 5 s a call)."""
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); torch.cuda.synchronize()
        times = []
        for _ in range(3 if s.elapsed_time(e) < 5000 else 1):
            s.record(); fn(); e.record(); torch.cuda.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    def hidden_ms(fn, calls=7, sleep_cycles=5_000_000):
        """GPU time of one call with its host time hidden: the GPU sleeps (~2.5 ms) while the
        host queues the call, and the clock starts when the sleep ends. (lab/overhead.py's
        reads dashgen.tools.timing, which an older tree may not have: written out here, like
        the timers above.)"""
        fn()
        times = []
        for _ in range(calls):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(True), torch.cuda.Event(True)
            torch.cuda._sleep(sleep_cycles)
            s.record(); fn(); e.record(); e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    if mode == "varlen":
        Path(out).write_text(json.dumps(measure_packs(dashgen, batch_ms), indent=1))
        return
    if mode == "gqa":
        Path(out).write_text(json.dumps(measure_gqa(dashgen, batch_ms, configs), indent=1))
        return
    seqlens = seqlens or ((1024, 4096, 16384) if mode == "time"
                          else (1024, 2048, 4096, 8192, 16384)) + LONG_SEQLENS
    res = {}
    for hd, causal in configurations(configs):
        for seq in seqlens:
            b, h = max(1, 16384 // seq), heads(hd)  # one sequence past 16,384 tokens
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v, do = (torch.randn(b, seq, h, hd, device="cuda", dtype=torch.bfloat16,
                                       generator=g) for _ in range(4))
            key = f"d{hd}_{'causal' if causal else 'full'}_{seq}"
            if mode == "fwd":
                call = lambda: dashgen.attention(q, k, v, causal=causal)  # noqa: E731
                with torch.no_grad():
                    res[key] = {"fwd_ms": batch_ms(call), "hashes": _hashes((call(),))}
                torch.cuda.empty_cache()
                continue
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            o = dashgen.attention(q, k, v, causal=causal, deterministic=True)
            long = seq > LONG_FROM
            timer = long_ms if long else call_ms if mode == "bits" else batch_ms
            bwd = timer(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            with torch.no_grad():
                fwd = timer(lambda: dashgen.attention(q, k, v, causal=causal, deterministic=True))
                o2 = dashgen.attention(q, k, v, causal=causal, deterministic=True)
            res[key] = {"bwd_ms": bwd, "fwd_ms": fwd}
            if long:  # the price of the order at this length: the same call unordered
                o3 = dashgen.attention(q, k, v, causal=causal, deterministic=False)
                res[key]["bwd_nondet_ms"] = timer(
                    lambda: torch.autograd.grad(o3, (q, k, v), do, retain_graph=True))
                del o3
            elif mode == "time":  # the kernels alone, so a moved row says where it moved
                res[key]["bwd_gpu_ms"] = hidden_ms(
                    lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
            if mode == "bits":
                grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                res[key]["hashes"] = _hashes((*grads, o2))
            torch.cuda.empty_cache()
    Path(out).write_text(json.dumps(res, indent=1))


LONG_FROM = 16384  # rows past this many tokens take the long timer and the non-det ratio
LONG_SEQLENS = (131072, 1048576)

CONFIGURATIONS = {f"d{hd}_{'causal' if causal else 'full'}": (hd, causal)
                  for hd in (64, 128) for causal in (False, True)}
# The wide head dims, by name only (--configs d256_full ...): a change to their kernels is
# compared on them; the default rows stay the four above.
WIDE_CONFIGURATIONS = {f"d{hd}_{'causal' if causal else 'full'}": (hd, causal)
                       for hd in (96, 192, 256) for causal in (False, True)}


def configurations(names: tuple[str, ...] | None) -> list[tuple[int, bool]]:
    """(head_dim, causal) of the named configurations (the four of CONFIGURATIONS without
    names; WIDE_CONFIGURATIONS' by name), in the table's order; raises ValueError naming
    --configs for a name it does not know."""
    known = {**CONFIGURATIONS, **WIDE_CONFIGURATIONS}
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        raise ValueError(f"--configs: unknown {', '.join(unknown)}; choose from "
                         f"{', '.join(known)}")
    if not names:
        return list(CONFIGURATIONS.values())
    return [hc for name, hc in known.items() if name in names]


def heads(head_dim: int, group: int = 1) -> int:
    """Query heads of the benchmark's hidden size 2048 at head_dim (10 at 192), a multiple of
    `group` (GQA's query heads a KV head)."""
    return 2048 // head_dim // group * group


def _hashes(tensors) -> list[str]:
    import torch
    return [hashlib.sha256(t.view(torch.int16).cpu().numpy().tobytes()).hexdigest()
            for t in tensors]


def timed_and_hashed(timer, call, leaves, do) -> dict:
    """One configuration's row: the backward of call()'s output and the no-grad forward, each
    through `timer`, and the hashes of the gradients and of the forward's output."""
    import torch
    o = call()
    bwd = timer(lambda: torch.autograd.grad(o, leaves, do, retain_graph=True))
    with torch.no_grad():
        fwd = timer(call)
        o2 = call()
    grads = torch.autograd.grad(o, leaves, do)
    return {"bwd_ms": bwd, "fwd_ms": fwd, "hashes": _hashes((*grads, o2))}


def measure_packs(dashgen, timer) -> dict:
    """Packed backward and forward times, and the bits, on the benchmark's kind of pack."""
    import itertools
    import torch
    from dashgen.tools.bench_varlen import document_lengths
    res = {}
    for hd in (64, 128):
        for causal in (False, True):
            for seed in range(3):
                lengths = document_lengths(16384, seed)
                g = torch.Generator(device="cuda").manual_seed(seed)
                q, k, v, do = (torch.randn(sum(lengths), 2048 // hd, hd, device="cuda",
                                           dtype=torch.bfloat16, generator=g) for _ in range(4))
                q, k, v = (t.requires_grad_() for t in (q, k, v))
                cu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32,
                                  device="cuda")
                n = max(lengths)
                call = lambda: dashgen.attention_varlen(  # noqa: E731
                    q, k, v, cu, cu, n, n, causal=causal, deterministic=True)
                key = f"pack{seed}_d{hd}_{'causal' if causal else 'full'}"
                res[key] = {**timed_and_hashed(timer, call, (q, k, v), do),
                            "documents": len(lengths), "longest": n}
                torch.cuda.empty_cache()
    return res


GQA_GROUP, GQA_SEQLENS = 4, (2048, 8192)


def measure_gqa(dashgen, timer, configs: tuple[str, ...] | None = None,
                device: str = "cuda", tokens: int = 16384) -> dict:
    """Grouped-query backward and forward times, and the bits: GQA_GROUP query heads a KV head,
    the benchmark's tokens and hidden size (`tokens` fewer in the CPU test), deterministic,
    schedule="auto"."""
    import torch
    res = {}
    for hd, causal in configurations(configs):
        h = heads(hd, GQA_GROUP)
        for seq in GQA_SEQLENS:
            b = max(1, tokens // seq)
            g = torch.Generator(device=device).manual_seed(0)
            q, do = (torch.randn(b, seq, h, hd, device=device, dtype=torch.bfloat16,
                                 generator=g) for _ in range(2))
            k, v = (torch.randn(b, seq, h // GQA_GROUP, hd, device=device, dtype=torch.bfloat16,
                                generator=g).requires_grad_() for _ in range(2))
            q.requires_grad_()
            call = lambda: dashgen.attention(q, k, v, causal=causal,  # noqa: E731
                                             deterministic=True)
            key = f"gqa{GQA_GROUP}_d{hd}_{'causal' if causal else 'full'}_{seq}"
            res[key] = timed_and_hashed(timer, call, (q, k, v), do)
            torch.cuda.empty_cache()
    return res


def report(old: list[dict], new: list[dict]) -> str:
    if all("bwd_ms" not in x[key] for x in old + new for key in x):
        return report_forward(old, new)
    # The host-hidden column where a row has it (long rows do not: their host time is noise).
    has_gpu = {key: all("bwd_gpu_ms" in x[key] for x in old + new) for key in old[0]}
    gpu = any(has_gpu.values())
    lines = ["| shape | bwd old ms | bwd new ms | old/new | fwd old ms | fwd new ms | old/new |"
             " bits |" + (" bwd gpu old ms | bwd gpu new ms | old/new |" if gpu else ""),
             "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if gpu else "")]
    rb, rf, rg = [], [], []
    for key in old[0]:
        bo, bn = (statistics.median(x[key]["bwd_ms"] for x in runs) for runs in (old, new))
        fo, fn = (statistics.median(x[key]["fwd_ms"] for x in runs) for runs in (old, new))
        rb.append(bo / bn)
        rf.append(fo / fn)
        bits = ("same" if all(x[key]["hashes"] == old[0][key]["hashes"] for x in old + new)
                else "DIFFER") if "hashes" in old[0][key] else "-"
        line = (f"| {key} | {bo:.3f} | {bn:.3f} | {bo / bn:.3f} | {fo:.3f} | {fn:.3f} | "
                f"{fo / fn:.3f} | {bits} |")
        if gpu and has_gpu[key]:
            go, gn = (statistics.median(x[key]["bwd_gpu_ms"] for x in runs)
                      for runs in (old, new))
            rg.append(go / gn)
            line += f" {go:.3f} | {gn:.3f} | {go / gn:.3f} |"
        elif gpu:
            line += " - | - | - |"
        lines.append(line)
    g = statistics.geometric_mean
    lines.append(f"\ngeomean old/new: backward {g(rb):.3f} (min {min(rb):.3f}), forward "
                 f"{g(rf):.3f} (min {min(rf):.3f})"
                 + (f", backward with the host hidden {g(rg):.3f} (min {min(rg):.3f})"
                    if gpu else "") + f"; {len(old)} runs of each tree, alternated")
    return "\n".join(lines + report_long(old, new))


def report_long(old: list[dict], new: list[dict]) -> list[str]:
    """The long rows' price of the order: each tree's deterministic over non-deterministic
    backward time, medians over the runs (above 1: the order costs that much)."""
    keys = [key for key in old[0] if "bwd_nondet_ms" in old[0][key]
            and all("bwd_nondet_ms" in x.get(key, {}) for x in old + new)]
    if not keys:
        return []
    lines = ["", "| long row | old det ms | old non-det ms | old det/non-det | new det ms | "
             "new non-det ms | new det/non-det |", "|---|---|---|---|---|---|---|"]
    for key in keys:
        cells = []
        for runs in (old, new):
            det, nondet = (statistics.median(x[key][f] for x in runs)
                           for f in ("bwd_ms", "bwd_nondet_ms"))
            cells.append(f"{det:.1f} | {nondet:.1f} | {det / nondet:.3f}")
        lines.append(f"| {key} | {cells[0]} | {cells[1]} |")
    return lines


def report_forward(old: list[dict], new: list[dict]) -> str:
    """The forward-only table (--mode fwd)."""
    lines = ["| shape | fwd old ms | fwd new ms | old/new | o bits |", "|---|---|---|---|---|"]
    ratios = []
    for key in old[0]:
        fo, fn = (statistics.median(x[key]["fwd_ms"] for x in runs) for runs in (old, new))
        ratios.append(fo / fn)
        same = lambda runs: all(x[key]["hashes"] == runs[0][key]["hashes"] for x in runs)  # noqa: E731
        bits = ("same" if same(old + new) else
                "differ, each tree repeats" if same(old) and same(new) else "NOT REPEATED")
        lines.append(f"| {key} | {fo:.4f} | {fn:.4f} | {fo / fn:.3f} | {bits} |")
    lines.append(f"\ngeomean old/new: forward {statistics.geometric_mean(ratios):.3f} "
                 f"(min {min(ratios):.3f}, max {max(ratios):.3f}); {len(old)} runs of each "
                 f"tree, alternated")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new", nargs="+", help="one or more trees, each compared to OLD")
    parser.add_argument("--mode", choices=("bits", "time", "fwd", "varlen", "gqa"),
                        default="time")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default="compare_out")
    parser.add_argument("--seqlens", type=int, nargs="+", default=None,
                        help="bits/time: the sequence lengths (default 1k-16k for bits, "
                             "1k/4k/16k for time)")
    parser.add_argument("--configs", nargs="+", default=None, metavar="dHD_MASK",
                        help="bits/time/fwd/gqa: only these configurations, e.g. d128_full "
                             "(default all four)")
    parser.add_argument("--child-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long one tree's run may take (default 600)")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure(str(Path(args.child[0]).resolve()), args.mode, args.child[1],
                tuple(args.seqlens) if args.seqlens else None,
                tuple(args.configs) if args.configs else None)
        return
    try:
        configurations(args.configs)
    except ValueError as exc:
        parser.error(str(exc))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = run_names(len(args.new))
    trees = dict(zip(names, [args.old, *args.new]))
    runs: dict[str, list[dict]] = {name: [] for name in names}
    failed: dict[str, str] = {}
    for r in range(args.runs):
        for name, tree in trees.items():
            if name in failed:
                continue
            path = out / f"{args.mode}_{name}_{r}.json"
            why = run_child([sys.executable, __file__, args.old, *args.new, "--mode", args.mode,
                             *(["--seqlens", *map(str, args.seqlens)] if args.seqlens else []),
                             *(["--configs", *args.configs] if args.configs else []),
                             "--child", tree, str(path)], args.child_timeout)
            if why is not None:
                failed[name] = f"run {r + 1}: {why}"
                print(f"{tree}: {failed[name]}; left out of the later runs", file=sys.stderr)
                if name == "old":
                    sys.exit(f"the old tree {tree} failed ({failed[name]}): nothing to compare "
                             f"against")
                continue
            runs[name].append(json.loads(path.read_text()))
    text = report_all(trees, runs, failed)
    (out / f"{args.mode}.md").write_text(text + "\n")
    print(text)


def run_child(cmd: list[str], timeout: float) -> str | None:
    """Run one tree's child process: None when it finished cleanly, else why not (its exit
    status, or the timeout after which it was killed, which ends its CUDA context and any
    kernel still running in it)."""
    try:
        proc = subprocess.run(cmd, timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"killed after --child-timeout ({timeout:g} s)"
    return None if proc.returncode == 0 else f"exit status {proc.returncode}"


def run_names(new_trees: int) -> list[str]:
    """The names of the runs' files: old and new with one new tree (as before), else old, new1,
    new2, ..."""
    if new_trees == 1:
        return ["old", "new"]
    return ["old", *(f"new{i}" for i in range(1, new_trees + 1))]


def report_all(trees: dict[str, str], runs: dict[str, list[dict]],
               failed: dict[str, str] | None = None) -> str:
    """One table against the old tree per new tree, headed by the new tree's path when there are
    several (with one, exactly `report`'s table); a tree in `failed` gets a line saying why it
    was left out instead of a table (its runs before the failure are not reported)."""
    failed = failed or {}
    news = [name for name in trees if name != "old"]

    def part(name: str) -> str:
        if name in failed:
            return f"{trees[name]}: left out ({failed[name]})"
        return report(runs["old"], runs[name])
    if len(news) == 1:
        return part(news[0])
    return "\n\n".join(f"## {name}: {trees[name]} against {trees['old']}\n\n" + part(name)
                        for name in news)


if __name__ == "__main__":
    main()
