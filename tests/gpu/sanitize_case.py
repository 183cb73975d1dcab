"""One small forward + backward per Hopper kernel variant, for compute-sanitizer to watch
(tests/gpu/test_sanitizer.py runs it under memcheck and racecheck). Prints the kernels it ran.

    python3 tests/gpu/sanitize_case.py [CASE_INDEX ...]

DASHGEN_EXPERIMENTS=double_ds,overlap_softmax,staged_stats switches those backward options on
(runtime.SM90_BWD_OPTIONS; the others keep their defaults) in the cases where the backward offers
them (kernels.sm90_bwd_refusal), the others run without."""
from __future__ import annotations

import math
import sys

import torch

from dashgen.runtime import backward as runtime
from dashgen.codegen.variants import sm90_bwd_refusal

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, dtype, schedule, workers,
# kernel): odd seqlens so the tails of every tile are exercised; GQA for the ordered dK/dV adds;
# both kernel families in fp16.
CASES = [
    (1, 200, 200, 2, 2, 128, True, torch.bfloat16, "symmetric_shift", 4, "auto"),
    (1, 300, 257, 4, 1, 128, False, torch.bfloat16, "shift", 4, "auto"),
    (1, 200, 200, 4, 2, 64, True, torch.bfloat16, "fa3", 3, "auto"),
    (1, 130, 130, 2, 1, 64, False, torch.float16, "spt", 3, "sm90"),
    (1, 130, 130, 2, 1, 64, False, torch.float16, "spt", 3, "mma"),
]


def main(picked: list[int], experiments: frozenset = frozenset()) -> None:
    defaults = dict(runtime.SM90_BWD_OPTIONS)
    for index in picked or range(len(CASES)):
        batch, sq, sk, hq, hkv, d, causal, dtype, schedule, workers, kernel = CASES[index]
        runtime.SM90_BWD_OPTIONS.update(defaults)
        for name in sorted(experiments):  # each where the backward offers it with the others
            chosen = {n: v for n, v in runtime.SM90_BWD_OPTIONS.items() if v and n != name}
            if sm90_bwd_refusal(d, hq != hkv, **chosen, **{name: True}) is None:
                runtime.SM90_BWD_OPTIONS[name] = True
        torch.manual_seed(sq * 131 + d)
        q = torch.randn(batch, sq, hq, d, device="cuda", dtype=dtype)
        k, v = (torch.randn(batch, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
        do = torch.randn_like(q)
        scale = 1 / math.sqrt(d)
        o, lse = runtime.forward(q, k, v, causal=causal, softmax_scale=scale, kernel=kernel)
        for deterministic in (True, False):
            runtime.backward(do, q, k, v, o, lse, causal=causal, softmax_scale=scale,
                             deterministic=deterministic, schedule=schedule, num_workers=workers,
                             kernel=kernel)
        torch.cuda.synchronize()
        print(f"ran fwd={runtime.forward_kernel(q, kernel)} bwd={runtime.backward_kernel(q, k, kernel)} "
              f"d{d} {'causal' if causal else 'full'} h{hq}/{hkv} {str(dtype)[6:]} {schedule}",
              flush=True)


def experiments_from_env() -> frozenset:
    import os
    names = frozenset(filter(None, os.environ.get("DASHGEN_EXPERIMENTS", "").split(",")))
    unknown = names - set(runtime.SM90_BWD_OPTIONS)
    if unknown:
        raise SystemExit(f"DASHGEN_EXPERIMENTS: unknown {sorted(unknown)}; known: "
                         f"{sorted(runtime.SM90_BWD_OPTIONS)}")
    return names


if __name__ == "__main__":
    main([int(arg) for arg in sys.argv[1:]], experiments_from_env())  # case indices; none: all
