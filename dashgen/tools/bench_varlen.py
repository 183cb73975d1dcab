"""`dashgen bench --varlen`: packed variable-length batches on the GPU. A pack of `--tokens`
tokens of documents whose lengths are log-normal (median 1024, sigma 1.0, capped at the pack),
each attending only within itself (full, or causal per document), against a fixed-length
control of the same tokens (batch tokens/1024 of 1024) and, on the same pack: SDPA on the
padded batch (a boolean mask for padding and causality), FlexAttention with a document mask,
and torch.nn.attention.varlen where the installed torch has it. Backward TFLOP/s count the FLOPs
the masks keep (2.5x the forward's: five matmuls against two); medians of CUDA-event timings,
the rows of a configuration timed in rounds as `dashgen bench` times them (timing.rounds_ms).
Writes DIR/bench_varlen.json and .md.
"""
from __future__ import annotations

import itertools
import json
import math
import random
import statistics
import time
from pathlib import Path

from .timing import commit_id, rounds_ms

MEDIAN_LENGTH, SIGMA = 1024, 1.0


def document_lengths(tokens: int, seed: int) -> list[int]:
    """Log-normal document lengths (median MEDIAN_LENGTH) filling exactly `tokens` tokens."""
    rng = random.Random(seed)
    out: list[int] = []
    while sum(out) < tokens:
        n = max(1, min(tokens, int(rng.lognormvariate(math.log(MEDIAN_LENGTH), SIGMA))))
        out.append(min(n, tokens - sum(out)))
    return out


def kept_pairs(lengths: list[int], causal: bool) -> int:
    return sum(n * (n + 1) // 2 if causal else n * n for n in lengths)


def _inputs(total: int, heads: int, head_dim: int, seed: int):
    import torch
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda: torch.randn(total, heads, head_dim, device="cuda",  # noqa: E731
                               dtype=torch.bfloat16, generator=gen)
    return make(), make(), make(), make()


def _backward(forward, tensors, do):
    """A backward closure: the forward runs once, each call differentiates it again."""
    import torch
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    o = forward(*leaves)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def rows_for(lengths, heads, head_dim, causal, seed, peers):
    """(label, setup) pairs: setup() returns the backward closure, or raises."""
    import torch
    import dashgen
    from ..runtime.select import PACK_AUTO_SCHEDULES
    total = sum(lengths)
    q, k, v, do = _inputs(total, heads, head_dim, seed)
    cu = torch.tensor([0] + list(itertools.accumulate(lengths)),
                      dtype=torch.int32, device="cuda")
    longest = max(lengths)

    def packed(deterministic, schedule="auto"):
        return lambda: _backward(lambda a, b, c: dashgen.attention_varlen(
            a, b, c, cu, cu, longest, longest, causal=causal, deterministic=deterministic,
            schedule=schedule), (q, k, v), do)

    def fixed():
        n = MEDIAN_LENGTH
        shape = (total // n, n, heads, head_dim)
        t = [x[: shape[0] * n].reshape(shape) for x in (q, k, v, do)]
        return _backward(lambda a, b, c: dashgen.attention(a, b, c, causal=causal,
                                                           deterministic=True), t[:3], t[3])

    def padded_sdpa():
        import torch.nn.functional as F
        batch = len(lengths)
        pad = lambda x: torch.zeros(batch, longest, heads, head_dim, device="cuda",  # noqa: E731
                                    dtype=x.dtype)
        tensors = []
        for x in (q, k, v, do):
            p_ = pad(x)
            for b, (a, e) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
                p_[b, : e - a] = x[a:e]
            tensors.append(p_.transpose(1, 2))
        n = torch.tensor(lengths, device="cuda")
        pos = torch.arange(longest, device="cuda")
        valid = pos[None, :] < n[:, None]
        mask = valid[:, None, :, None] & valid[:, None, None, :]
        if causal:
            mask = mask & (pos[:, None] >= pos[None, :])[None, None]
        # Padding rows see no key: give them their own diagonal so no row is all -inf.
        mask = mask | torch.eye(longest, dtype=torch.bool, device="cuda")[None, None]
        return _backward(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=mask),
                         tensors[:3], tensors[3])

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        doc = torch.repeat_interleave(torch.arange(len(lengths), device="cuda"),
                                      torch.tensor(lengths, device="cuda"))

        def mask_mod(b, h, qi, ki):
            same = doc[qi] == doc[ki]
            return same & (qi >= ki) if causal else same
        block = create_block_mask(mask_mod, None, None, total, total, device="cuda")
        fn = torch.compile(flex_attention, dynamic=False)
        tr = lambda x: x.transpose(0, 1)[None]  # noqa: E731
        return _backward(lambda a, b, c: fn(tr(a), tr(b), tr(c), block_mask=block)[0]
                         .transpose(0, 1), (q, k, v), do)

    def torch_varlen():
        import inspect
        from torch.nn.attention.varlen import varlen_attn
        # Its causal switch: is_causal in its first release, window_size (-1, 0) since.
        named = inspect.signature(varlen_attn).parameters
        mask = ({"is_causal": causal} if "is_causal" in named
                else {"window_size": (-1, 0)} if causal else {})
        return _backward(lambda a, b, c: varlen_attn(a, b, c, cu, cu, longest, longest, **mask),
                         (q, k, v), do)

    # Every schedule a pack runs for this mask, so that the pack's auto is the measured best.
    auto = PACK_AUTO_SCHEDULES[causal]
    others = tuple(s for s in ("fa3", "spt", "descending",
                               "symmetric_shift" if causal else "shift") if s != auto)
    rows = [(f"dashgen varlen det (auto: {auto})", packed(True)),
            ("dashgen varlen nondet", packed(False)),
            *((f"dashgen varlen det {s}", packed(True, s)) for s in others),
            (f"dashgen fixed-length det ({MEDIAN_LENGTH} x {total // MEDIAN_LENGTH})", fixed)]
    if "sdpa_padded" in peers:
        rows.append(("sdpa padded batch (mask)", padded_sdpa))
    if "flex" in peers:
        rows.append(("flex document mask", flex))
    if "torch_varlen" in peers:
        rows.append(("torch.nn.attention.varlen", torch_varlen))
    return rows


PEERS = ("sdpa_padded", "flex", "torch_varlen")


def kernel_times(fn, calls: int = 5) -> dict:
    """GPU time per call of each kernel fn launches (torch.profiler, microseconds), where the
    pack's time goes against the fixed-length control's: plan, preprocess, main, convert."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    times: dict = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = getattr(event, "cuda_time_total", 0)
        if total:
            times[event.key] = round(total / calls, 1)
    return dict(sorted(times.items(), key=lambda kv: -kv[1])[:12])


def _error(exc: Exception, limit: int = 300) -> str:
    return f"{type(exc).__name__}: {exc}"[:limit]


def measure_rows(plan, config: dict, pairs: int, fixed_pairs: int, warmup: int, repeats: int,
                 rounds: int, warmup_ms: float, time_once=None, breakdown=None) -> list[dict]:
    """One configuration's rows: every (label, setup) of `plan` set up first, then timed in
    rounds, as `dashgen bench` times a configuration. Timed one row after another, a row's
    figure followed the rows before it (hybrid 6-15% behind the shift orders' rows in one run,
    where their kernels with the host hidden are 1.3-3.4% apart; docs/design.md `bench-rounds`).
    A row that fails to set up or to run gets its error, not the sweep's end; dashgen's rows
    also get their kernels' GPU times (`breakdown`, kernel_times by default)."""
    breakdown = breakdown or kernel_times
    head_dim, heads = config["head_dim"], config["heads"]
    rows, fns = [], {}
    for label, setup in plan:
        rows.append({"label": label, **config, "ms": None, "tflops": None, "error": None})
        try:
            fns[label] = setup()
        except Exception as exc:  # a peer that cannot run here is reported, not fatal
            rows[-1]["error"] = _error(exc)
    blocks: dict = {}
    medians, errors = rounds_ms(fns, warmup, repeats, rounds=rounds, time_once=time_once,
                                warmup_ms=warmup_ms, blocks=blocks)
    for row in rows:
        label = row["label"]
        if label in errors:
            row["error"] = _error(errors[label])
        elif label in medians:
            work = fixed_pairs if "fixed-length" in label else pairs
            ms = medians[label]
            row.update(ms=ms, tflops=10 * head_dim * heads * work / ms / 1e9,
                       times=[[round(t, 4) for t in b] for b in blocks[label]])
            if label.startswith("dashgen"):
                try:
                    row["kernels_us"] = breakdown(fns[label])
                except Exception as exc:  # the timing stands without the breakdown
                    row["kernels_us"] = _error(exc, 200)
    return rows


def run(args) -> int:
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("dashgen bench --varlen needs a CUDA GPU")
    peers = [] if args.peers == ["none"] else list(PEERS)
    lengths = document_lengths(args.tokens, seed=0)
    results = []
    for head_dim in args.hdims:
        heads = args.hidden // head_dim
        for mask in args.masks:
            causal = mask == "causal"
            pairs = kept_pairs(lengths, causal)
            fixed_pairs = (args.tokens // MEDIAN_LENGTH) * kept_pairs([MEDIAN_LENGTH], causal)
            plan = rows_for(lengths, heads, head_dim, causal, 0, peers)
            config = dict(head_dim=head_dim, heads=heads, mask=mask)
            for row in measure_rows(plan, config, pairs, fixed_pairs, args.warmup, args.repeats,
                                    args.rounds, args.warmup_ms):
                results.append(row)
                print(f"[d{head_dim} {mask}] {row['label']}: "
                      + (f"{row['ms']:.3f} ms, {row['tflops']:.1f} TFLOP/s" if row["ms"]
                         else row["error"]), flush=True)
            del plan  # its setups hold this configuration's inputs
            torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    meta = dict(gpu=props.name, torch=torch.__version__, commit=commit_id(args.commit),
                date=time.strftime("%Y-%m-%dT%H:%M:%S%z"), tokens=args.tokens,
                hidden=args.hidden, repeats=args.repeats, rounds=args.rounds,
                warmup_ms=args.warmup_ms, documents=len(lengths),
                lengths=lengths, median_length=statistics.median(lengths),
                distribution=f"log-normal, median {MEDIAN_LENGTH}, sigma {SIGMA}, capped at "
                             f"the pack")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_varlen.json").write_text(json.dumps({"meta": meta, "rows": results}, indent=1))
    lines = [f"# Packed batches: {meta['gpu']}, {meta['date']}, {meta['commit']}", "",
             f"{len(lengths)} documents in {args.tokens} tokens ({meta['distribution']}); "
             f"backward ms and TFLOP/s of the kept FLOPs.", "",
             "| head_dim | mask | row | ms | TFLOP/s |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['head_dim']} | {r['mask']} | {r['label']} | "
                     + (f"{r['ms']:.3f} | {r['tflops']:.1f} |" if r["ms"] else
                        f"- | {r['error'][:80]} |"))
    (out / "bench_varlen.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0
