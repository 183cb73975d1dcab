"""One small forward + backward per kernel variant, for compute-sanitizer to watch
(tests/gpu/test_sanitizer.py runs it under memcheck and racecheck). Prints the kernels it ran.

    python3 tests/gpu/sanitize_case.py [CASE_INDEX ...]

DASHGEN_SANITIZE_FLIPPED=1 runs every case with each per-problem policy (fused_convert,
early_kv, persistent_forward; two dQ writers with the converter) switched from what
dashgen.runtime.select picks, through Overrides,
so the variants select leaves out on these shapes run too."""
from __future__ import annotations

import itertools
import math
import os
import sys

import torch

import dashgen
from dashgen.runtime.backward import backward
from dashgen.runtime.forward import forward, forward_variant
from dashgen.codegen.variants import DQ_WRITERS_KERNEL_HEAD_DIMS
from dashgen.runtime.select import Overrides, selection

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, schedule, workers):
# odd seqlens so the tails of every tile are exercised; GQA for the ordered dK/dV adds; fp16.
CASES = [
    (1, 200, 200, 2, 2, 128, True, torch.bfloat16, "symmetric_shift", 4),
    (1, 300, 257, 4, 1, 128, False, torch.bfloat16, "shift", 4),
    (1, 200, 200, 4, 2, 64, True, torch.bfloat16, "fa3", 3),
    (1, 130, 130, 2, 1, 64, False, torch.float16, "spt", 3),
    (1, 333, 333, 2, 2, 128, True, torch.bfloat16, "descending", 5),
    # head_dim 96 in the 128 kernel: a store past a row's 96 columns is past the tensor's end
    # in its last row.
    (1, 257, 200, 6, 2, 96, False, torch.bfloat16, "shift", 4),
    (1, 200, 200, 3, 3, 96, True, torch.float16, "spt", 3),
    # head_dim 192 and 256: the swapped mainloop (dQ's pieces through one shared buffer)
    (1, 200, 200, 2, 1, 192, True, torch.bfloat16, "spt", 3),  # three pieces: two and one
    (1, 257, 130, 2, 2, 256, False, torch.bfloat16, "shift", 4),
    # the other padded head dims: 32 and 48 in the 64 kernels, 80 and 112 in the 128 ones
    (1, 257, 200, 6, 2, 80, False, torch.bfloat16, "shift", 4),
    (1, 200, 200, 3, 3, 112, True, torch.float16, "spt", 3),
    (1, 130, 257, 4, 2, 32, True, torch.bfloat16, "fa3", 3),
    (1, 300, 300, 2, 1, 48, True, torch.bfloat16, "symmetric_shift", 4),
]
# The score modifiers' kernels (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, options,
# dtype, schedule): windows (rows and keys no window reaches, both bounds, GQA) and soft-capping.
MODIFIER_CASES = [
    (1, 300, 300, 4, 2, 128, dict(window_size=(100, 0)), torch.bfloat16, "spt_listed"),
    (1, 200, 500, 2, 2, 64, dict(window_size=(50, 20)), torch.float16, "fa3"),
    (1, 257, 130, 6, 2, 96, dict(window_size=(-1, 40)), torch.bfloat16, "descending"),
    (1, 257, 257, 4, 1, 128, dict(softcap=20.0, causal=True), torch.bfloat16, "auto"),
    # Long enough that select fuses the dQ converter into the window kernels (GQA; rows no key
    # reaches, which the convert kernel still zeroes).
    (1, 1000, 1000, 4, 2, 128, dict(window_size=(127, 0)), torch.bfloat16, "spt_listed"),
    (1, 900, 500, 4, 4, 64, dict(window_size=(64, 0)), torch.float16, "spt_listed"),
    (1, 300, 300, 4, 2, 112, dict(window_size=(100, 0)), torch.bfloat16, "spt_listed"),
    (1, 257, 257, 4, 1, 32, dict(softcap=20.0, causal=True), torch.bfloat16, "auto"),
]
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
# Packs (lengths, heads_q, heads_kv, head_dim, causal, dtype, schedule): empty and one-token
# sequences and odd tails, every pack schedule, for the plan kernel and the packed variants.
VARLEN_CASES = [
    ((0, 1, 130, 257, 64), 4, 2, 64, True, torch.bfloat16, "fa3"),
    ((300, 1, 0, 129), 2, 2, 128, True, torch.bfloat16, "descending"),
    ((257, 5, 200), 2, 1, 128, False, torch.bfloat16, "shift"),
    ((64, 0, 190), 2, 2, 64, False, torch.float16, "spt"),
    ((333, 17, 128), 2, 2, 64, True, torch.bfloat16, "symmetric_shift"),
    # hybrid (a pack's auto) with both of its orders: 8,300 keys is past its 64 KV tiles.
    ((8300, 300, 1, 0), 2, 1, 64, False, torch.bfloat16, "hybrid"),
    ((333, 17, 128), 2, 2, 128, True, torch.bfloat16, "hybrid"),
    ((300, 1, 0, 129), 3, 1, 96, True, torch.bfloat16, "spt"),
    ((300, 1, 0, 129), 2, 1, 80, True, torch.bfloat16, "spt"),
    ((257, 5, 200), 2, 2, 48, False, torch.float16, "shift"),
]


def flipped(q_shape, k_shape, dtype: str, causal: bool, schedule: str, workers: int,
            sms: int) -> Overrides:
    """Overrides that switch each policy from what select picks for these shapes (the swapped
    backward has no fused converter to switch on)."""
    sel = selection(q_shape, k_shape, dtype, causal, True, False, schedule, workers, sms,
                    Overrides())
    fwd = forward_variant(q_shape, k_shape, dtype, causal, sms, Overrides())
    fused = None if sel.backward.swapped else not sel.backward.fused_convert
    # Two dQ writers run without the converter, in the 64 and 128 kernels: one writer where
    # select gave two, two where it gave one and the flip leaves the converter off.
    writers = None
    if sel.backward.dq_writers == 2:
        writers = 1
    elif sel.backward.kernel_head_dim in DQ_WRITERS_KERNEL_HEAD_DIMS and fused is False:
        writers = 2
    return Overrides(fused_convert=fused, early_kv=not sel.backward.early_kv,
                     persistent_forward=not fwd.persistent, dq_writers=writers)


def main(picked: list[int], flip: bool = False) -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for index in picked or range(len(CASES)):
        batch, sq, sk, hq, hkv, d, causal, dtype, schedule, workers = CASES[index]
        torch.manual_seed(sq * 131 + d)
        q = torch.randn(batch, sq, hq, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        scale = 1 / math.sqrt(d)
        name = DTYPES[dtype]
        shapes = tuple(q.shape), tuple(k.shape)
        overrides = (flipped(*shapes, name, causal, schedule, workers, sms) if flip
                     else Overrides())
        o, lse = forward(q, k, v, causal=causal, softmax_scale=scale, overrides=overrides)
        ran = [forward_variant(*shapes, name, causal, sms, overrides).kernel_name]
        for deterministic in (True, False):
            backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                     deterministic=deterministic, schedule=schedule, num_workers=workers,
                     overrides=overrides)
            ran.append(selection(*shapes, name, causal, deterministic, False, schedule, workers,
                                 sms, overrides).backward.kernel_name)
        torch.cuda.synchronize()
        print(f"ran fwd={ran[0]} bwd={ran[1]},{ran[2]} {schedule}", flush=True)
    if not flip:  # packs and modifiers force their policies: nothing to switch
        for case in VARLEN_CASES:
            packed(*case)
        for case in MODIFIER_CASES:
            modified(*case)


def packed(lengths, hq, hkv, d, causal, dtype, schedule) -> None:
    """One packed forward + backward, ordered and not, through dashgen.attention_varlen."""
    total = sum(lengths)
    torch.manual_seed(total)
    q = torch.randn(total, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(total, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(2))
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    for deterministic in (True, False):
        o = dashgen.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), causal=causal,
                                     deterministic=deterministic, schedule=schedule)
        torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    torch.cuda.synchronize()
    print(f"ran varlen {schedule} lengths={lengths}", flush=True)


def modified(batch, sq, sk, hq, hkv, d, options, dtype, schedule) -> None:
    """One forward + backward, ordered and not, of a window or soft-capped call."""
    torch.manual_seed(sq * 7 + d)
    q = torch.randn(batch, sq, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(batch, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
            for _ in range(2))
    for deterministic in (True, False):
        o = dashgen.attention(q, k, v, deterministic=deterministic,
                              schedule=schedule if deterministic else "auto", **options)
        torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    torch.cuda.synchronize()
    print(f"ran modifier {schedule} {options}", flush=True)


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]],  # case indices; none: all
         flip=os.environ.get("DASHGEN_SANITIZE_FLIPPED") == "1")
