"""Grouped-query attention's backward, dashgen beside FlashAttention-3, in one process on one GPU:
4 query heads a KV head (Llama's grouping), 16,384 query tokens at hidden 2048, 2k and 8k keys,
both head_dims and masks (compare_trees.py --mode gqa's shapes), deterministic and not.

Per cell: 3 warm-up calls, then 80 ms of calls, then the median of 15 calls, each timed with CUDA
events around torch.autograd.grad (host time counts, for both alike); the implementations
alternate cell by cell in two sweeps of opposite order, and a cell's figure is the median of its
sweeps. Each deterministic cell's dq/dk/dv are compared bitwise over its warm-up calls, and
dashgen's gradients against FA3's (largest relative difference of the norms).

FA3 is the anchor kit's build (ANCHOR_MODE=build ANCHOR_BUILDS=fa3 leaves it under
/tmp/anchors/fa3/hopper): PYTHONPATH=/tmp/anchors/fa3/hopper:. python3 scripts/gqa_against_fa3.py
--out DIR
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from compare_trees import GQA_GROUP, GQA_SEQLENS, configurations  # scripts/ is on the path
from dashgen.tools.timing import WARMUP_MS, event_ms

TOKENS, HIDDEN = 16384, 2048


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch
    import flash_attn_interface as fa3
    import dashgen

    def run(impl, q, k, v, causal, det):
        if impl == "fa3":
            o = fa3.flash_attn_func(q, k, v, causal=causal, deterministic=det)
            o = o[0] if isinstance(o, tuple) else o
        else:
            o = dashgen.attention(q, k, v, causal=causal, deterministic=det)
        return o

    def cell(impl, q, k, v, do, causal, det):
        def call():
            o = run(impl, q, k, v, causal, det)
            return torch.autograd.grad(o, (q, k, v), do)
        first = [call() for _ in range(3)]
        bitwise = all(torch.equal(a, b) for g in first[1:] for a, b in zip(first[0], g))
        for _ in range(max(1, int(WARMUP_MS / max(event_ms(call), 1e-3)))):
            call()
        times = [event_ms(call) for _ in range(15)]
        return statistics.median(times), bitwise, first[0]

    rows = []
    configs = [(d, c, sk) for d, c in configurations(None) for sk in GQA_SEQLENS]
    for d, causal, seqlen in configs:
        heads_q = HIDDEN // d
        batch = TOKENS // seqlen
        torch.manual_seed(0)
        q = torch.randn(batch, seqlen, heads_q, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, seqlen, heads_q // GQA_GROUP, d, device="cuda",
                            dtype=torch.bfloat16) for _ in range(2))
        do = torch.randn_like(q)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        flops = 2.5 * 4 * batch * heads_q * seqlen * seqlen * d / (2 if causal else 1)
        for det in (True, False):
            ms = {"fa3": [], "dashgen": []}
            grads, bits, errors = {}, {}, {}
            for order in (("fa3", "dashgen"), ("dashgen", "fa3")):
                for impl in order:
                    try:
                        t, b, g = cell(impl, q, k, v, do, causal, det)
                    except Exception as exc:  # noqa: BLE001 (an anchor that cannot run this cell)
                        errors[impl] = repr(exc)[:300]
                        continue
                    ms[impl].append(t)
                    grads[impl], bits[impl] = g, b
            row = dict(hdim=d, causal=causal, seqlen=seqlen, heads_q=heads_q,
                       heads_kv=heads_q // GQA_GROUP, batch=batch, deterministic=det, errors=errors)
            for impl in ms:
                if ms[impl]:
                    row[f"{impl}_ms"] = statistics.median(ms[impl])
                    row[f"{impl}_tflops"] = flops / row[f"{impl}_ms"] / 1e9
                    row[f"{impl}_bitwise"] = bits[impl]
            if len(grads) == 2:
                norms = [(a.double().norm().item(), b.double().norm().item())
                         for a, b in zip(grads["dashgen"], grads["fa3"])]
                row["grad_norm_rel_diff"] = max(abs(ours - theirs) / theirs
                                                for ours, theirs in norms)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gqa_against_fa3.json").write_text(json.dumps(
        dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, rows=rows), indent=1))
    text = table(rows)
    (out / "gqa_against_fa3.md").write_text(text + "\n")
    print(text)


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: TFLOP/s of both, their ratio, bits over repeats, and the
    gradients' agreement; a cell an implementation could not run shows "-"."""
    lines = ["| config | mode | dashgen TFLOP/s | FA3 TFLOP/s | dashgen / FA3 | "
             "bitwise (dashgen, FA3) | grad norms rel. diff |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"d{r['hdim']} {'causal' if r['causal'] else 'full'} {r['seqlen']}"
        mode = "det" if r["deterministic"] else "nondet"
        ours, theirs = r.get("dashgen_tflops"), r.get("fa3_tflops")
        ratio = f"{ours / theirs:.3f}" if ours and theirs else "-"
        diff = r.get("grad_norm_rel_diff")
        lines.append(f"| {name} | {mode} | {_f(ours)} | {_f(theirs)} | {ratio} | "
                     f"{r.get('dashgen_bitwise', '-')}, {r.get('fa3_bitwise', '-')} | "
                     f"{'-' if diff is None else f'{diff:.1e}'} |")
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


if __name__ == "__main__":
    main()
