"""Attention backward benchmark on the ANCHORS.md protocol: dashgen's schedules (deterministic and
not) and forward, against SDPA cuDNN, SDPA flash (deterministic) and FlexAttention, same inputs.

    dashgen bench --out bench_out          # the 20 core configurations and the long rows
    dashgen bench --seqlens 2048 --hdims 128 --masks causal --peers none
    (from a checkout without installing: PYTHONPATH=. python3 -m dashgen bench ...)

Writes DIR/bench.json, DIR/bench.md and DIR/bench.png; prints the markdown table last.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import sys
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from .bench_report import plot, render_markdown, seq_label
from .timing import (REPEATS, ROUNDS, WARMUP_MS, commit_id, event_ms, median_ms,  # noqa: F401
                     rounds_ms)  # the protocol's timing


PEERS = ("cudnn", "flash_det", "flex")
# One sequence of these lengths per head_dim and mask in every run, so that no change can cost
# the long rows unseen (docs/design.md, `dq-last-long`): a 1M call takes 10-45 s, so each long
# row is the deterministic and the unordered backward as schedule="auto" picks them, one warm
# call and LONG_REPEATS timed ones.
LONG_SEQLENS = [131072, 1048576]
LONG_REPEATS = 3
BWD_OVER_FWD = 2.5  # the backward runs five matmuls of the forward's size to its two


def fwd_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int,
              causal: bool) -> float:
    # QK^T and PV: 2 matmuls x 2 FLOPs per multiply-add; a causal mask keeps half of the scores.
    flops = 4 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def window_pairs(seqlen: int, left: int | None, right: int | None) -> int:
    """(query, key) pairs a window keeps over one sequence of seqlen queries and keys: row i
    sees keys max(0, i - left) .. min(seqlen - 1, i + right) (None: unbounded)."""
    n = seqlen
    left = n if left is None else left
    right = n if right is None else right
    # In closed form (a 1M-token row asks for it too): the last keys, min(n - 1, i + right),
    # summed: i + right for the k = n - right rows that stop short of the end, n - 1 for the
    # rest; the first keys, max(0, i - left), summed: 0 + 1 + ... over the n - left rows past
    # the left bound.
    k = max(0, n - right)
    last = k * (k - 1) // 2 + k * right + (n - k) * (n - 1)
    m = max(0, n - left)
    first = m * (m - 1) // 2
    return last - first + n


@dataclass(frozen=True)
class Config:
    seqlen: int
    head_dim: int
    mask: str
    tokens: int
    hidden: int

    @property
    def batch(self) -> int:
        return max(1, self.tokens // self.seqlen)

    @property
    def heads(self) -> int:
        return self.hidden // self.head_dim

    @property
    def causal(self) -> bool:
        return self.mask == "causal"

    @property
    def window(self) -> tuple[int, int]:
        """FlashAttention's window_size of a "window:LEFT,RIGHT" mask ((-1, -1): none)."""
        if not self.mask.startswith("window:"):
            return (-1, -1)
        left, right = (int(x) for x in self.mask[len("window:"):].split(","))
        return (left, right)

    def flops(self, backward: bool) -> float:
        if self.window != (-1, -1):
            # The pairs the window keeps, as the schedule problem counts them: QK^T and PV,
            # 2 x 2 FLOPs per pair and head_dim column.
            left, right = (None if x < 0 else x for x in self.window)
            pairs = window_pairs(self.seqlen, left, right)
            f = 4 * self.batch * self.heads * pairs * self.head_dim
        else:
            f = fwd_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim,
                          self.causal)
        return f * BWD_OVER_FWD if backward else f

    def floor_bytes(self) -> int:
        # dQ accumulator in fp32 plus LSE and D (fp32 each) per query row and head.
        return self.batch * self.heads * self.seqlen * (4 * self.head_dim + 8)


@dataclass
class Row:
    label: str
    impl: str
    schedule: str | None
    deterministic: bool | None
    direction: str  # "backward" or "forward"
    seqlen: int
    head_dim: int
    mask: str
    batch: int
    heads: int
    num_workers: int | None = None
    ms: float | None = None
    tflops: float | None = None
    extra_bytes: int | None = None
    floor_bytes: int | None = None
    error: str | None = None
    picked: str | None = None  # schedule="auto" rows: the schedule auto resolves to
    times: list | None = None  # ms of the timed calls, one list per round (the run's noise)


# -- measuring ---------------------------------------------------------------------------------

def extra_backward_bytes(backward) -> int:
    """Peak memory the backward allocates beyond its gradient outputs."""
    import torch
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    grads = backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    return peak - before - sum(g.numel() * g.element_size() for g in grads)


@contextlib.contextmanager
def deterministic_algorithms(flag: bool):
    import torch
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(flag)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def make_inputs(cfg: Config, seed: int = 0):
    """q, k, v, do: bf16 randn in (batch, seqlen, heads, head_dim); prepared before timing."""
    import torch
    torch.manual_seed(seed)
    shape = (cfg.batch, cfg.seqlen, cfg.heads, cfg.head_dim)
    return tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))


def leaves(inputs):
    q, k, v, do = inputs
    return tuple(t.detach().requires_grad_() for t in (q, k, v)), do


# Each setup_* builds the forward graph once and returns the backward to time (or the forward).

def setup_dashgen(cfg: Config, inputs, schedule: str, deterministic: bool, num_workers):
    import torch
    from dashgen.runtime.op import attention
    (q, k, v), do = leaves(inputs)
    o = attention(q, k, v, causal=cfg.causal, deterministic=deterministic, schedule=schedule,
                  num_workers=num_workers, window_size=cfg.window)
    return lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)


def setup_dashgen_forward(cfg: Config, inputs):
    import torch
    from dashgen.runtime.op import attention
    q, k, v, _ = inputs

    def forward():
        with torch.no_grad():
            return attention(q, k, v, causal=cfg.causal, window_size=cfg.window)
    return forward


def setup_sdpa_forward(cfg: Config, inputs, backend_name: str):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    q, k, v, _ = (t.transpose(1, 2) for t in inputs)  # the layout models pass, as above

    def forward():
        with torch.no_grad(), sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)
    return forward


def setup_sdpa(cfg: Config, inputs, backend_name: str, deterministic: bool):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = getattr(SDPBackend, backend_name)
    (q, k, v), do = leaves(inputs)
    # SDPA wants (batch, heads, seqlen, head_dim): views of the same storage, as models pass it.
    with sdpa_kernel(backend), deterministic_algorithms(deterministic):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=cfg.causal)
    do_t = do.transpose(1, 2)

    def backward():
        # The flash backward reads the deterministic flag when it runs, not when o was made.
        with deterministic_algorithms(deterministic):
            return torch.autograd.grad(o, (q, k, v), do_t, retain_graph=True)
    return backward


_FLEX = None


def setup_flex(cfg: Config, inputs):
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    global _FLEX
    if _FLEX is None:
        # one static compile per shape; 20 configurations would pass the default limit of 8
        # and silently fall back to the unfused (and memory-hungry) eager path
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 64)
                break
        _FLEX = torch.compile(flex_attention, dynamic=False)
    (q, k, v), do = leaves(inputs)
    block_mask = None
    if cfg.causal:
        block_mask = create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None,
                                       cfg.seqlen, cfg.seqlen, device="cuda")
    elif cfg.window != (-1, -1):
        left, right = (cfg.seqlen if x < 0 else x for x in cfg.window)
        block_mask = create_block_mask(
            lambda b, h, q_idx, kv_idx: (q_idx - kv_idx <= left) & (kv_idx - q_idx <= right),
            None, None, cfg.seqlen, cfg.seqlen, device="cuda")
    o = _FLEX(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=block_mask)
    do_t = do.transpose(1, 2)
    return lambda: torch.autograd.grad(o, (q, k, v), do_t, retain_graph=True)


def schedule_problem(cfg: Config):
    """The schedule problem of a configuration, with the tiles of the kernel that serves it."""
    from dashgen.runtime.select import problem_for
    return problem_for(cfg.batch, cfg.heads, cfg.heads, cfg.seqlen, cfg.seqlen, cfg.head_dim,
                       cfg.causal, cfg.window)


def dashgen_schedules(cfg: Config, wanted: list[str] | None) -> list[str]:
    """The named schedules timed beside the auto row, which always runs (so "auto" in
    --schedules adds nothing: `--schedules auto` times the auto row alone)."""
    from dashgen import list_schedules
    from dashgen.schedule.builders import unsupported_reason
    problem = schedule_problem(cfg)
    names = list_schedules() if wanted is None else [n for n in wanted if n != "auto"]
    return [n for n in names if unsupported_reason(n, problem) is None]


def rows_for(cfg: Config, schedules: list[str] | None, peers: list[str], sm_count: int):
    """(Row, setup) pairs for one configuration, in table order. A shift schedule runs on the
    worker count schedule="auto" gives it (select.balanced_workers), so that the auto row and
    its pick's row run the same kernel on the same workers."""
    from dashgen.runtime.select import resolve_schedule
    base = dict(seqlen=cfg.seqlen, head_dim=cfg.head_dim, mask=cfg.mask, batch=cfg.batch,
                heads=cfg.heads, floor_bytes=cfg.floor_bytes())
    out = []
    names = dashgen_schedules(cfg, schedules)
    problem = schedule_problem(cfg)
    auto_name, auto_workers = resolve_schedule(problem, "auto", None, sm_count)
    worker_counts = {name: auto_workers if name == auto_name else None for name in names}
    for det in (True, False):
        for name in names:
            workers = worker_counts[name]
            tag = "det" if det else "nondet"
            row = Row(f"dashgen_{tag} {name}", "dashgen", name, det, "backward",
                      num_workers=workers, **base)
            out.append((row, lambda inputs, n=name, d=det, w=workers:
                        setup_dashgen(cfg, inputs, n, d, w)))
    # What a user gets without choosing: schedule="auto", num_workers=None (a separate impl, so
    # lab/calibrate.py does not take it for a schedule). Timed right after its pick's
    # deterministic row: rounds alternate direction, so each of the two rows of the same kernel
    # follows the other in half the rounds and the rows before them in the other half. Placed
    # last, it followed only fast rows while its pick followed slow ones, and measured 2-5%
    # below it at d128 causal 16k in 8 of 10 runs (docs/design.md, `bench-auto-row-order`).
    picked, auto_workers = auto_pick(cfg, sm_count)
    auto_row = (Row("dashgen_det auto", "dashgen_auto", "auto", True, "backward",
                    num_workers=auto_workers, picked=picked, **base),
                lambda inputs: setup_dashgen(cfg, inputs, "auto", True, None))
    labels = [row.label for row, _ in out]
    pick_label = f"dashgen_det {picked}"
    out.insert(labels.index(pick_label) + 1 if pick_label in labels else len(names), auto_row)
    # The forward does not depend on the schedule: one row, timed through the public op.
    out.append((Row("dashgen forward", "dashgen", None, None, "forward", **base),
                lambda inputs: setup_dashgen_forward(cfg, inputs)))
    if cfg.window != (-1, -1):
        # SDPA's flash and cuDNN backends take no window: flex (a block mask) is the peer.
        peers = [name for name in peers if name == "flex"]
    if "flash_det" in peers:  # the forward to beat (ANCHORS.md): SDPA's flash forward
        out.append((Row("sdpa_flash forward", "sdpa_flash", None, None, "forward", **base),
                    lambda inputs: setup_sdpa_forward(cfg, inputs, "FLASH_ATTENTION")))
    if "cudnn" in peers:  # the forward to beat now: cuDNN's (ANCHORS.md, 2026-12-01)
        out.append((Row("sdpa_cudnn forward", "sdpa_cudnn", None, None, "forward", **base),
                    lambda inputs: setup_sdpa_forward(cfg, inputs, "CUDNN_ATTENTION")))
        out.append((Row("sdpa_cudnn (nondet)", "sdpa_cudnn", None, False, "backward", **base),
                    lambda inputs: setup_sdpa(cfg, inputs, "CUDNN_ATTENTION", False)))
    if "flash_det" in peers:
        out.append((Row("sdpa_flash_det (FA2)", "sdpa_flash", None, True, "backward", **base),
                    lambda inputs: setup_sdpa(cfg, inputs, "FLASH_ATTENTION", True)))
    if "flex" in peers:
        out.append((Row("flex (det)", "flex", None, True, "backward", **base),
                    lambda inputs: setup_flex(cfg, inputs)))
    return out


def long_rows_for(cfg: Config, sm_count: int):
    """(Row, setup) pairs of a long configuration (one sequence): dashgen's backward with
    schedule="auto", deterministic then not; their ratio is the price of the order at that
    length. The schedules, the forwards and the peers are the 1k-16k rows' comparison."""
    from dashgen.runtime.select import resolve_schedule
    base = dict(seqlen=cfg.seqlen, head_dim=cfg.head_dim, mask=cfg.mask, batch=cfg.batch,
                heads=cfg.heads, floor_bytes=cfg.floor_bytes())
    out = []
    for det in (True, False):
        picked, workers = resolve_schedule(schedule_problem(cfg), "auto", None, sm_count, det)
        row = Row(f"dashgen_{'det' if det else 'nondet'} auto", "dashgen_auto", "auto", det,
                  "backward", num_workers=workers, picked=picked, **base)
        out.append((row, lambda inputs, d=det: setup_dashgen(cfg, inputs, "auto", d, None)))
    return out


def auto_pick(cfg: Config, sm_count: int) -> tuple[str | None, int | None]:
    """(schedule, worker count) schedule="auto" runs for a configuration: the op's own rule
    (bf16, the heads_q == heads_kv the benchmark uses, num_workers=None on an sm_count-SM GPU)."""
    from dashgen.runtime.select import resolve_schedule
    try:
        return resolve_schedule(schedule_problem(cfg), "auto", None, sm_count)
    except ValueError:
        return None, None


def _error_text(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (("n/a: " if "No available kernel" in text else "") +
            f"{type(exc).__name__}: {text}")[:300]


def measure_configuration(plan: list, cfg: Config, inputs, warmup: int, repeats: int,
                          time_once=None, extra_bytes=extra_backward_bytes,
                          rounds: int = ROUNDS, warmup_ms: float = WARMUP_MS) -> list[Row]:
    """Set up every row of a configuration, time them in rounds (rounds_ms), then take
    each backward's extra memory (`extra_bytes(fn)`). One failing row must not stop the sweep:
    it gets an error."""
    fns = {}
    for index, (row, setup) in enumerate(plan):
        try:
            fns[index] = setup(inputs)
        except Exception as exc:
            row.error = _error_text(exc)
            if os.environ.get("BENCH_TRACEBACK"):
                traceback.print_exception(exc)
    blocks: dict = {}
    medians, errors = rounds_ms(fns, warmup, repeats, rounds=rounds, time_once=time_once,
                                warmup_ms=warmup_ms, blocks=blocks)
    for index, (row, _) in enumerate(plan):
        if index in errors:
            row.error = _error_text(errors[index])
        elif index in medians:
            row.ms = medians[index]
            row.times = [[round(t, 4) for t in block] for block in blocks[index]]
            row.tflops = cfg.flops(row.direction == "backward") / (row.ms * 1e-3) / 1e12
            if row.direction == "backward":
                try:
                    row.extra_bytes = extra_bytes(fns[index])
                except Exception as exc:
                    row.error = _error_text(exc)
    return [row for row, _ in plan]


# -- environment -------------------------------------------------------------------------------

def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception as exc:  # report, do not fail the run over it
        return f"unknown ({type(exc).__name__})"


def environment(args) -> dict:
    import torch
    props = torch.cuda.get_device_properties(0)
    return dict(gpu=props.name, sm_count=props.multi_processor_count,
                capability=f"{props.major}.{props.minor}", torch=torch.__version__,
                torch_cuda=torch.version.cuda, nvrtc=nvrtc_version(),
                commit=commit_id(args.commit),
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                tokens=args.tokens, hidden=args.hidden, repeats=args.repeats,
                warmup=args.warmup, warmup_ms=args.warmup_ms, dtype="bf16", rounds=args.rounds,
                round_order="alternating",
                long_repeats=getattr(args, "long_repeats", LONG_REPEATS))


# -- command line ------------------------------------------------------------------------------

def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _ints_or_none(text: str) -> list[int]:
    return [] if text == "none" else _ints(text)


def _names(text: str) -> list[str]:
    return [x for x in text.split(",") if x]


def add_options(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The benchmark's options (`dashgen bench`; build_parser for running this module alone)."""
    p.add_argument("--seqlens", type=_ints, default=[1024, 2048, 4096, 8192, 16384],
                   help="comma list (default 1024,2048,4096,8192,16384)")
    p.add_argument("--long-seqlens", type=_ints_or_none, default=list(LONG_SEQLENS),
                   help="one sequence of each length, after the 1k-16k rows: dashgen's "
                        "deterministic and unordered backward (schedule auto), one warm call "
                        "and --long-repeats timed ones (default 131072,1048576; 'none': no "
                        "long rows)")
    p.add_argument("--long-repeats", type=int, default=LONG_REPEATS,
                   help=f"timed calls of a long row, median (default {LONG_REPEATS})")
    p.add_argument("--hdims", type=_ints, default=[64, 128], help="comma list (default 64,128)")
    p.add_argument("--masks", type=_names, default=["full", "causal"],
                   help="comma list of full, causal, window:LEFT,RIGHT (FlashAttention's "
                        "window_size, e.g. window:4095,0; default full,causal)")
    p.add_argument("--schedules", type=_names, default=None,
                   help="comma list of dashgen schedules (default: every one that serves the "
                        "mask); the auto row always runs, 'auto' alone times only it")
    p.add_argument("--peers", type=_names, default=list(PEERS),
                   help=f"comma list from {','.join(PEERS)}, or 'none'")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"timed runs, median (default {REPEATS}; protocol: >= 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first (protocol: >= 3)")
    p.add_argument("--warmup-ms", type=float, default=WARMUP_MS,
                   help=f"then each row runs this much more GPU time untimed, every round "
                   f"(default {WARMUP_MS:g}: the clocks settle after the previous row)")
    p.add_argument("--rounds", type=int, default=ROUNDS,
                   help=f"blocks each row's timed calls are split into, every block after its "
                   f"own warm-ups, rows in turn, every second round in reverse (default "
                   f"{ROUNDS}; more spread a row over more of the configuration's time)")
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden / head_dim")
    p.add_argument("--commit", default=None, help="commit id to record (default: git rev-parse)")
    p.add_argument("--varlen", action="store_true",
                   help="packed variable-length batches instead (dashgen.tools.bench_varlen: "
                        "log-normal documents, median 1024, against SDPA padded, FlexAttention "
                        "with a document mask and torch.nn.attention.varlen; --peers none "
                        "drops them)")
    p.add_argument("--out", type=Path, default=Path("bench_out"),
                   help="folder for bench.json, bench.md, bench.png (default ./bench_out)")
    return p


def build_parser() -> argparse.ArgumentParser:
    return add_options(argparse.ArgumentParser(description=__doc__.splitlines()[0]))


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Measure, write DIR/bench.json, bench.md, bench.png, print the table; SystemExit with a
    message on bad options or without a CUDA GPU."""
    if getattr(args, "varlen", False):
        from .bench_varlen import run as run_varlen
        return run_varlen(args)
    peers = [] if args.peers == ["none"] else args.peers
    unknown = set(peers) - set(PEERS)
    if unknown:
        raise SystemExit(f"--peers: unknown {sorted(unknown)}; choose from {list(PEERS)}")
    for mask in args.masks:
        if mask not in ("full", "causal") and not re.fullmatch(r"window:-?\d+,-?\d+", mask):
            raise SystemExit(f"--masks: unknown {mask!r}; choose from full, causal, "
                             f"window:LEFT,RIGHT")
    if not 0 <= args.warmup_ms <= 10_000:
        raise SystemExit(f"--warmup-ms: {args.warmup_ms} must be between 0 and 10000")
    if not 1 <= args.rounds <= args.repeats:
        raise SystemExit(f"--rounds: {args.rounds} must be between 1 and --repeats "
                         f"({args.repeats}): every round times each row at least once")
    if args.long_repeats < 1:
        raise SystemExit(f"--long-repeats: {args.long_repeats} must be at least 1")
    if args.repeats < 10 or args.warmup < 3:
        print("note: fewer than 10 repeats or 3 warm-ups is outside the ANCHORS.md protocol",
              file=sys.stderr)
    import torch
    if not torch.cuda.is_available():
        raise SystemExit("the benchmark needs a CUDA GPU (sm_90: H100/H200); none is visible")
    meta = environment(args)
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []

    def sweep(seqlens, plan_of, warmup, repeats, rounds, warmup_ms):
        """Every (head_dim, mask, seqlen) of the run, each configuration's rows planned by
        plan_of(cfg), timed, printed as they come and kept in `rows`."""
        for head_dim in args.hdims:
            for mask in args.masks:
                for seqlen in seqlens:
                    cfg = Config(seqlen, head_dim, mask, args.tokens, args.hidden)
                    inputs = make_inputs(cfg)
                    try:
                        plan = plan_of(cfg)
                    except Exception as exc:  # e.g. an unknown --schedules name
                        raise SystemExit(f"cannot plan {cfg}: {exc}") from None
                    for row in measure_configuration(plan, cfg, inputs, warmup, repeats,
                                                     rounds=rounds, warmup_ms=warmup_ms):
                        rows.append(row)
                        shown = row.error or f"{row.ms:.3f} ms, {row.tflops:.1f} TFLOP/s"
                        print(f"[{seq_label(seqlen)} d{head_dim} {mask}] {row.label}: {shown}",
                              file=sys.stderr, flush=True)
                    del inputs, plan
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()

    sweep(args.seqlens, lambda cfg: rows_for(cfg, args.schedules, peers, meta["sm_count"]),
          args.warmup, args.repeats, args.rounds, args.warmup_ms)
    # The long rows: one warm call each, no rounds (a 1M call takes 10-45 s).
    sweep(args.long_seqlens, lambda cfg: long_rows_for(cfg, meta["sm_count"]), 1,
          args.long_repeats, 1, 0.0)
    data = [asdict(r) for r in rows]
    (args.out / "bench.json").write_text(json.dumps(dict(meta=meta, rows=data), indent=1) + "\n")
    table = render_markdown(meta, data)
    (args.out / "bench.md").write_text(table + "\n")
    why_not = plot(data, args.out / "bench.png")
    if why_not:
        print(why_not, file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
