"""One deterministic backward for Nsight Compute, dashgen's or FlashAttention-3's (or, with
--nondeterministic, the backward without the dQ order, FA3's atomic one), at one of the
benchmark's configurations (16,384 tokens, 2048 / head_dim heads, bf16 randn, seed 0): two
backwards to warm up, then one between cudaProfilerStart and cudaProfilerStop, so that
`ncu --profile-from-start off` sees that backward's kernels alone (autograd launches them from
its own thread, which a per-thread NVTX range would miss). lab/ncu_compare.py then lines up
the longest kernel of each report, the main kernel. The same sections for both:

ncu --profile-from-start off --clock-control none --section SpeedOfLight \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --csv --page details \
    python3 lab/ncu_backward.py --impl fa3 --fa3-path /tmp/anchors/fa3/hopper \
    --head-dim 64 --mask causal --seqlen 8192 > fa3.csv

FA3 is the anchor kit's build (ANCHOR_MODE=build leaves it under /tmp/anchors/fa3/hopper; its
HDIM96/192/256 switches for those head dims); --impl dashgen runs this checkout's
schedule="auto". lab/ncu_backward.sh runs both under the same sections and makes the table.
With override flags (lab/time_kernels.py's: --early-kv on, ...) dashgen's backward runs
through the runtime's forward and backward with those Overrides instead of autograd, e.g. K/V
loaded early: --impl dashgen --head-dim 256 --mask full --seqlen 4096 --early-kv on.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from dashgen.codegen.variants import served_head_dims  # noqa: E402
from dashgen.tools.bench import Config, leaves, make_inputs  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # lab/
from time_kernels import add_override_flags, overrides_from  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
HEAD_DIMS, MASKS = served_head_dims(), ("full", "causal")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", choices=("dashgen", "fa3"), required=True)
    ap.add_argument("--fa3-path", help="the folder holding FA3's flash_attn_interface.py")
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--mask", required=True)
    ap.add_argument("--seqlen", type=int, required=True)
    ap.add_argument("--nondeterministic", dest="deterministic", action="store_false",
                    help="deterministic=False: the backward without the dQ order (where "
                         "dashgen converts dQ in the kernel, short sequences, its ordered one)")
    add_override_flags(ap)
    args = ap.parse_args(argv)
    if args.head_dim not in HEAD_DIMS:
        ap.error(f"--head-dim must be one of {HEAD_DIMS}, got {args.head_dim}")
    if args.mask not in MASKS:
        ap.error(f"--mask must be one of {MASKS}, got {args.mask!r}")
    if not 128 <= args.seqlen <= TOKENS or TOKENS % args.seqlen:
        ap.error(f"--seqlen must divide {TOKENS} and be at least 128, got {args.seqlen}")
    if args.impl == "fa3" and not (args.fa3_path and
                                   (Path(args.fa3_path) / "flash_attn_interface.py").is_file()):
        ap.error("--impl fa3 needs --fa3-path, a folder with flash_attn_interface.py in it, "
                 f"got {args.fa3_path!r}")
    if args.impl == "fa3" and overridden(args):
        ap.error("the override flags choose dashgen's kernels: --impl dashgen")
    return args


def overridden(args: argparse.Namespace) -> bool:
    """Whether any override flag is set (then the runtime's backward runs, not autograd's)."""
    from dashgen.runtime.select import Overrides
    return overrides_from(args) != Overrides()


def runtime_backward(args: argparse.Namespace, q, k, v, do):
    """() -> None: dashgen's backward of (q, k, v) under the override flags, through the
    runtime's forward and backward (attention() takes no Overrides)."""
    from dashgen.runtime.backward import backward
    from dashgen.runtime.forward import forward
    overrides, causal = overrides_from(args), args.mask == "causal"
    q, k, v, do = (t.detach() for t in (q, k, v, do))
    scale = q.shape[-1] ** -0.5
    o, lse = forward(q, k, v, causal=causal, softmax_scale=scale, overrides=overrides)
    return lambda: backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                            deterministic=args.deterministic, schedule="auto", num_workers=None,
                            overrides=overrides)


def attention_fn(args: argparse.Namespace):
    """(q, k, v) -> o for the implementation, deterministic unless --nondeterministic, with the
    configuration's mask."""
    causal, deterministic = args.mask == "causal", args.deterministic
    if args.impl == "dashgen":
        import dashgen
        return lambda q, k, v: dashgen.attention(q, k, v, causal=causal,
                                                 deterministic=deterministic)
    sys.path.insert(0, args.fa3_path)
    import flash_attn_interface

    def fa3(q, k, v):
        out = flash_attn_interface.flash_attn_func(q, k, v, causal=causal,
                                                   deterministic=deterministic)
        return out[0] if isinstance(out, tuple) else out
    return fa3


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import torch
    cfg = Config(args.seqlen, args.head_dim, args.mask, TOKENS, HIDDEN)
    (q, k, v), do = leaves(make_inputs(cfg))
    if overridden(args):
        run = runtime_backward(args, q, k, v, do)
    else:
        o = attention_fn(args)(q, k, v)
        run = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    run()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
