"""Batch invariance of packed attention on the GPU: every sequence of random packs gets from
dashgen.attention_varlen exactly the o, dq, dk, dv bits that dashgen.attention gives it alone
(batch 1), for every schedule that serves the mask. Per case a pool of sequences (log-normal
lengths, empty and one-token sequences among them, seqlen_q != seqlen_k in a third) is run
alone once; each pack draws pool sequences in random order, repeats allowed, so a sequence
meets many neighbours and positions. One pack per case is also checked against float64
(within 2x PyTorch's own error in the inputs' dtype). Prints a table, writes JSON.

python3 lab/varlen_invariance.py --packs 200 --out DIR
"""
from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import dashgen  # noqa: E402

DTYPE = torch.bfloat16  # the inputs' dtype (--dtype)
SCHEDULES = {False: ("fa3", "spt", "descending", "shift", "hybrid"),
             True: ("fa3", "spt", "descending", "symmetric_shift", "hybrid")}


def random_lengths(rng: random.Random, tokens: int, max_len: int) -> list[int]:
    """Log-normal lengths (median ~300 here, capped), with empty and one-token sequences mixed
    in, until about `tokens` tokens."""
    out = []
    while sum(out) < tokens:
        r = rng.random()
        if r < 0.08:
            out.append(0)
        elif r < 0.16:
            out.append(1)
        else:
            out.append(min(max_len, max(2, int(rng.lognormvariate(5.7, 1.0)))))
    return out


def past_hybrid_bound(causal: bool) -> int:
    """A length of more than HYBRID_MAX_TILES KV tiles (128 keys each), so that hybrid runs it
    in fa3 / descending order (either mask: the bound counts tiles)."""
    from dashgen.schedule.builders import HYBRID_MAX_TILES
    return 128 * HYBRID_MAX_TILES + 77


def pack(lengths_q, lengths_k, heads_q, heads_kv, head_dim, gen):
    cu = lambda ls: torch.tensor([0] + list(itertools.accumulate(ls)),  # noqa: E731
                                 dtype=torch.int32, device="cuda")
    tq, tk = sum(lengths_q), sum(lengths_k)
    q = torch.randn(tq, heads_q, head_dim, device="cuda", dtype=DTYPE, generator=gen)
    k = torch.randn(tk, heads_kv, head_dim, device="cuda", dtype=DTYPE, generator=gen)
    v = torch.randn(tk, heads_kv, head_dim, device="cuda", dtype=DTYPE, generator=gen)
    do = torch.randn(tq, heads_q, head_dim, device="cuda", dtype=DTYPE, generator=gen)
    return q, k, v, do, cu(lengths_q), cu(lengths_k)


def grads(fn, q, k, v, do):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    o = fn(*leaves)
    return (o.detach(), *torch.autograd.grad(o, leaves, do))


class Pool:
    """Sequences (q, k, v, dO) and the o, dq, dk, dv dashgen.attention gives each alone (batch
    1; zeros where a sequence has no queries or no keys), for packs to be drawn from."""

    def __init__(self, lengths_q, lengths_k, heads_q, heads_kv, head_dim, causal, schedule,
                 gen):
        self.items = []
        for lq, lk in zip(lengths_q, lengths_k):
            q, k, v, do, _, _ = pack([lq], [lk], heads_q, heads_kv, head_dim, gen)
            if lq and lk:
                alone = grads(lambda a, c, d: dashgen.attention(
                    a[None], c[None], d[None], causal=causal, deterministic=True,
                    schedule=schedule)[0], q, k, v, do)
            else:
                alone = tuple(torch.zeros_like(t) for t in (q, q, k, v))
            self.items.append(((q, k, v, do), alone))

    def pack(self, members):
        """q, k, v, dO of pool sequences `members` packed in that order, their lengths and
        offsets."""
        parts = [self.items[i][0] for i in members]
        q, k, v, do = (torch.cat([p[j] for p in parts]) for j in range(4))
        lq = [p[0].shape[0] for p in parts]
        lk = [p[1].shape[0] for p in parts]
        cu = lambda ls: torch.tensor([0] + list(itertools.accumulate(ls)),  # noqa: E731
                                     dtype=torch.int32, device="cuda")
        return q, k, v, do, lq, lk, cu(lq), cu(lk)


def check_pack(pool, members, causal, schedule):
    """Pack pool sequences `members` (in that order, repeats allowed): the first sequence and
    output whose packed bits differ from its own, or None."""
    q, k, v, do, lq, lk, cu_q, cu_k = pool.pack(members)
    packed = grads(lambda a, b, c: dashgen.attention_varlen(
        a, b, c, cu_q, cu_k, max(lq), max(lk), causal=causal, deterministic=True,
        schedule=schedule), q, k, v, do)
    oq, ok = cu_q.tolist(), cu_k.tolist()
    for b, i in enumerate(members):
        rows = (slice(oq[b], oq[b + 1]),) * 2 + (slice(ok[b], ok[b + 1]),) * 2
        for name, x, y, r in zip(("o", "dq", "dk", "dv"), packed, pool.items[i][1], rows):
            if not torch.equal(x[r], y):
                diff = (x[r].float() - y.float()).abs().max().item()
                return (f"position {b} (pool sequence {i}, {lq[b]}x{lk[b]}): {name} differs "
                        f"(max |diff| {diff:.3e})")
    return None


def repeats_equal(pool, members, causal, schedule, repeats: int) -> int:
    """Repeats of one pack's forward and backward, while a second stream keeps the GPU busy with
    matmuls of its own (so the workers' timing varies): how many differ from the first."""
    q, k, v, do, lq, lk, cu_q, cu_k = pool.pack(members)
    fn = lambda a, b, c: dashgen.attention_varlen(  # noqa: E731
        a, b, c, cu_q, cu_k, max(lq), max(lk), causal=causal, deterministic=True,
        schedule=schedule)
    first = grads(fn, q, k, v, do)
    busy = torch.cuda.Stream()
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    differ = 0
    for r in range(repeats):
        with torch.cuda.stream(busy):
            for _ in range(1 + r % 3):
                x = (x @ x).clamp_(-1, 1)
        got = grads(fn, q, k, v, do)
        differ += not all(torch.equal(a, b) for a, b in zip(got, first))
    torch.cuda.synchronize()
    return differ


def float64_error(lengths, heads_q, heads_kv, head_dim, causal, gen) -> dict:
    """dq/dk/dv/o of a pack against float64 per sequence (SDPA math), and PyTorch's bf16."""
    q, k, v, do, cu_q, cu_k = pack(lengths, lengths, heads_q, heads_kv, head_dim, gen)
    m = max(lengths)
    ours = grads(lambda a, b, c: dashgen.attention_varlen(a, b, c, cu_q, cu_k, m, m,
                                                          causal=causal), q, k, v, do)
    group = heads_q // heads_kv
    F = torch.nn.functional

    def ref(dtype):
        outs = [[], [], [], []]
        offs = cu_q.tolist()
        for b in range(len(lengths)):
            s = slice(offs[b], offs[b + 1])
            if offs[b + 1] == offs[b]:
                continue
            tr = lambda t: t[s].to(dtype).transpose(0, 1)[None]  # noqa: E731
            fn = lambda a, c, d: F.scaled_dot_product_attention(  # noqa: E731
                a, c.repeat_interleave(group, 1), d.repeat_interleave(group, 1),
                is_causal=causal)
            got = grads(fn, tr(q), tr(k), tr(v), tr(do))
            for i, x in enumerate(got):
                outs[i].append(x[0].transpose(0, 1))
        return [torch.cat(x) for x in outs]

    r64, r16 = ref(torch.float64), ref(DTYPE)
    keep = torch.cat([torch.arange(a, b, device="cuda") for a, b in
                      zip(cu_q.tolist(), cu_q.tolist()[1:]) if b > a])
    result = {}
    for name, x, a, t in zip(("o", "dq", "dk", "dv"), ours, r64, r16):
        x = x[keep]  # the key offsets are the query offsets here
        err = ((x.double() - a).norm() / a.norm()).item()
        limit = ((t.double() - a).norm() / a.norm()).item()
        result[name] = {"error": err, "torch_bf16": limit, "within_2x": err <= 2 * limit + 1e-6}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--packs", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=6000, help="tokens per pack (about)")
    ap.add_argument("--pool-tokens", type=int, default=12000,
                    help="tokens of the sequences packs are drawn from, per case")
    ap.add_argument("--repeats", type=int, default=0,
                    help="then repeat each case's last pack this often beside a busy stream")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--commit", help="commit id to record (default: git rev-parse)")
    args = ap.parse_args(argv)
    from dashgen.tools.timing import commit_id
    global DTYPE
    DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    rng = random.Random(args.seed)
    gen = torch.Generator(device="cuda").manual_seed(args.seed)
    cases = [(64, 8, 2), (128, 4, 4)]
    rows, failures, start = [], 0, time.time()
    for head_dim, hq, hkv in cases:
        for causal in (False, True):
            err = float64_error([700, 0, 1, 129, 1000], hq, hkv, head_dim, causal, gen)
            for schedule in SCHEDULES[causal]:
                lq = random_lengths(rng, args.pool_tokens, 2048)
                if schedule == "hybrid":
                    # One sequence past the bound, so that packs hold both of hybrid's orders.
                    lq.append(past_hybrid_bound(causal))
                # A third of the sequences give the keys lengths of their own.
                lk = [max(0, n_ + rng.randint(-40, 200)) if n_ and rng.random() < 0.33 else n_
                      for n_ in lq]
                pool = Pool(lq, lk, hq, hkv, head_dim, causal, schedule, gen)
                bad, n = [], 0
                for _ in range(args.packs):
                    members, tokens = [], 0
                    while tokens < args.tokens:
                        members.append(rng.randrange(len(lq)))
                        tokens += lq[members[-1]]
                    msg = check_pack(pool, members, causal, schedule)
                    n += 1
                    if msg:
                        bad.append(msg)
                differ = (repeats_equal(pool, members, causal, schedule, args.repeats)
                          if args.repeats else 0)
                failures += len(bad) + differ
                rows.append({"head_dim": head_dim, "heads": f"{hq}/{hkv}",
                             "mask": "causal" if causal else "full", "schedule": schedule,
                             "packs": n, "bitwise_equal": n - len(bad), "failures": bad[:5],
                             "pool_longest_q": max(lq), "pool_sequences": len(lq),
                             "repeats_busy_stream": args.repeats, "repeats_differing": differ,
                             "float64": err})
                print(f"d{head_dim} {hq}/{hkv} {'causal' if causal else 'full'} {schedule} "
                      f"(pool of {len(lq)}, longest {max(lq)}): "
                      f"{n - len(bad)}/{n} packs bitwise equal to batch 1; "
                      f"{args.repeats - differ}/{args.repeats} repeats equal; float64 "
                      + " ".join(f"{k}={v['error']:.2e}({'ok' if v['within_2x'] else 'BAD'})"
                                 for k, v in err.items()), flush=True)
                if bad:
                    print("   first:", bad[0], flush=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "seconds": round(time.time() - start, 1),
            "tokens_per_pack": args.tokens, "pool_tokens": args.pool_tokens, "dtype": args.dtype,
            "packs_per_case": args.packs, "commit": commit_id(args.commit)}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "varlen_invariance.json").write_text(json.dumps(
            {"meta": meta, "rows": rows}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
