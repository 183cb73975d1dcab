"""Training check: a Llama-style model (transformers LlamaConfig) trained on packed
variable-length documents, with dashgen as its attention (attn_implementation="dashgen", the
padding-free kwargs cu_seq_lens_q/k) under torch.use_deterministic_algorithms(True), twice: the
two runs' losses and final parameters must be bitwise identical. The same run with "sdpa"
(transformers masks the pack) gives the loss curve to compare against; step times against
"sdpa" without and with the deterministic flag and "flex_attention", eager and compiled.

Documents: log-normal lengths (median 1024, sigma 1.0) packed into rows of --tokens tokens
(--data: a repeated random motif per document, or walks through a fixed successor table);
every run sees the same batches (seeded per step). Writes DIR/train_packed.json and .png.

CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 lab/train_packed.py --out DIR
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def documents(step: int, tokens: int, vocab: int, data: str = "motif"):
    """input_ids, labels, position_ids (1, tokens) and cu_seqlens of the pack for `step`.
    "motif": each document repeats a random 64-token motif (learnable only in context);
    "successor": each is a walk through one fixed successor table over 1000 tokens (the
    successor nine times in ten, else a random token), which a model learns within steps."""
    rng = random.Random(1000 + step)
    table = random.Random(7).sample(range(min(vocab, 1000)), min(vocab, 1000))
    lengths, ids = [], []
    while sum(lengths) < tokens:
        n = min(tokens - sum(lengths),
                max(2, int(rng.lognormvariate(math.log(1024), 1.0))))
        if data == "motif":
            motif = [rng.randrange(vocab) for _ in range(64)]
            ids += [motif[i % 64] for i in range(n)]
        else:
            token = rng.randrange(len(table))
            for _ in range(n):
                ids.append(token)
                token = table[token] if rng.random() < 0.9 else rng.randrange(len(table))
        lengths.append(n)
    labels = list(ids)
    start = 0
    for n in lengths:
        labels[start] = -100  # the previous document's last token does not predict this one
        start += n
    positions = [p for n in lengths for p in range(n)]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    as_row = lambda x: torch.tensor(x, dtype=torch.long)[None]  # noqa: E731
    return as_row(ids), as_row(labels), as_row(positions), torch.tensor(cu, dtype=torch.int32), \
        max(lengths)


def build(args, impl: str, device: str):
    import transformers
    if impl == "dashgen":
        from dashgen.interfaces import transformers as hf
        hf.register()
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, head_dim=args.hidden // args.heads,
        max_position_embeddings=args.tokens, attn_implementation=impl)
    torch.manual_seed(args.seed)
    return transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)


def train(args, impl: str, deterministic: bool, steps: int, compiled: bool, device: str):
    """Losses per step, step times (ms), and a digest of the final parameters."""
    torch.use_deterministic_algorithms(deterministic)
    model = build(args, impl, device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, foreach=True)
    forward = torch.compile(model) if compiled else model
    losses, times = [], []
    for step in range(steps):
        ids, labels, positions, cu, longest = (t.to(device) if torch.is_tensor(t) else t
                                               for t in documents(step, args.tokens, args.vocab,
                                                                  args.data))
        kwargs = {}
        if impl == "dashgen":  # the collator's padding-free kwargs: no offsets found on the host
            kwargs = dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest,
                          max_length_k=longest)
        start = torch.cuda.Event(enable_timing=True) if device == "cuda" else None
        end = torch.cuda.Event(enable_timing=True) if device == "cuda" else None
        t0 = time.perf_counter()
        if start is not None:
            start.record()
        loss = forward(input_ids=ids, labels=labels, position_ids=positions, use_cache=False,
                       **kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if end is not None:
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            times.append((time.perf_counter() - t0) * 1e3)
        losses.append(loss.item())
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    torch.use_deterministic_algorithms(False)
    return dict(impl=impl, deterministic=deterministic, compiled=compiled, steps=steps,
                losses=losses, step_ms=statistics.median(times[min(5, steps - 1):]),
                params_sha256=digest.hexdigest())


def plot(runs, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        if r["steps"] >= 50:
            ax.plot(r["losses"], label=r["label"], linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write(args, runs) -> bool | None:
    """DIR/train_packed.json and .png of the runs so far; whether the first two deterministic
    dashgen runs agree bit for bit (losses and final parameters); None with fewer than two."""
    det = [r for r in runs if r["impl"] == "dashgen" and not r["compiled"] and r["error"] is None]
    same = (None if len(det) < 2 else det[0]["losses"] == det[1]["losses"]
            and det[0]["params_sha256"] == det[1]["params_sha256"])
    sdpa = next((r for r in runs if r["label"] == "sdpa" and r["error"] is None), None)
    gap = (max(abs(a - b) for a, b in zip(det[0]["losses"], sdpa["losses"]))
           if det and sdpa else None)
    from dashgen.tools.timing import commit_id
    meta = dict(date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
                commit=commit_id(args.commit),
                gpu=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                config=dict(layers=args.layers, hidden=args.hidden, heads=args.heads,
                            kv_heads=args.kv_heads, head_dim=args.hidden // args.heads,
                            vocab=args.vocab, tokens=args.tokens, lr=args.lr, data=args.data),
                dashgen_runs_bitwise_identical=same, max_loss_gap_to_sdpa=gap)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_packed.json").write_text(json.dumps({"meta": meta, "runs": runs},
                                                           indent=1))
    plot([r for r in runs if r["error"] is None], args.out / "train_packed.png")
    print(f"dashgen runs bitwise identical (losses and parameters): {same}; "
          f"largest loss gap to sdpa: {gap}")
    return same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--timing-steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--data", choices=("motif", "successor"), default="motif")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    # Quick runs first: a time limit keeps them (flex compiles for minutes, sdpa under the flag
    # takes 1.4 s a step).
    ap.add_argument("--runs", default="dashgen,dashgen,sdpa,dashgen_compiled,sdpa_compiled,"
                                      "flex_compiled,sdpa_det,sdpa_det_compiled,flex",
                    help="comma list: dashgen (deterministic), sdpa, sdpa_det, flex, each "
                         "optionally _compiled; the first two dashgen runs are compared")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", help="commit id to record (default: git rev-parse)")
    args = ap.parse_args(argv)
    impls = {"dashgen": ("dashgen", True), "sdpa": ("sdpa", False), "sdpa_det": ("sdpa", True),
             "flex": ("flex_attention", False)}
    runs = []
    for name in args.runs.split(","):
        base = name.removesuffix("_compiled")
        impl, det = impls[base]
        compiled = name.endswith("_compiled")
        steps = args.steps if base in ("dashgen", "sdpa") and not compiled else args.timing_steps
        t0 = time.time()
        try:
            r = train(args, impl, det, steps, compiled, args.device)
            r["error"] = None
        except Exception as exc:  # a peer that cannot run is reported, not fatal
            r = dict(impl=impl, deterministic=det, compiled=compiled, steps=steps, losses=[],
                     step_ms=None, params_sha256=None, error=f"{type(exc).__name__}: {exc}"[:400])
        r["label"] = name + (" (deterministic flag)" if det else "")
        r["wall_s"] = round(time.time() - t0, 1)
        runs.append(r)
        print(f"{r['label']}: {r['steps']} steps, "
              + (f"step {r['step_ms']:.1f} ms, loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}"
                 if r["error"] is None else r["error"]) + f" ({r['wall_s']} s)", flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
        write(args, runs)  # after every run: a time limit keeps what is done
    same = write(args, runs)
    return 1 if same is False else 0


if __name__ == "__main__":
    sys.exit(main())
