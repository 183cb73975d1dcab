#!/usr/bin/env bash
# Pipe utilization of the forward's attention kernel, dashgen's beside SDPA cuDNN's, per
# configuration: one Nsight Compute report of the forward call (scripts/ncu_forward.py, its first
# kernel launch), its raw page as CSV, and scripts/ncu_pipes.py's table. On the H200, from the
# project root:
#
#   bash scripts/ncu_forward_pipes.sh OUT_DIR d64-full-4096 d128-full-16384 ...
#
# writes OUT_DIR/<config>.<impl>.raw.csv, .log and OUT_DIR/<config>.pipes.md.
set -euo pipefail
if (( $# < 2 )); then
    echo "usage: bash scripts/ncu_forward_pipes.sh OUT_DIR CONFIG [CONFIG ...]" >&2
    echo "  CONFIG: d<head dim>-<full|causal>-<seqlen>, e.g. d64-full-4096" >&2
    exit 2
fi
out=$1; shift
mkdir -p "$out"
for config in "$@"; do
    IFS=- read -r dim mask seqlen <<<"$config"
    columns=()
    for impl in dashgen cudnn; do
        base=$out/$config.$impl
        rm -f "$base.ncu-rep"
        if ncu --profile-from-start off --clock-control none --launch-count 1 \
               --section SpeedOfLight --section ComputeWorkloadAnalysis \
               --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
               -o "$base" python3 scripts/ncu_forward.py --impl "$impl" --head-dim "${dim#d}" \
               --mask "$mask" --seqlen "$seqlen" > "$base.log" 2>&1 &&
           ncu -i "$base.ncu-rep" --page raw --csv > "$base.raw.csv" 2>> "$base.log"; then
            columns+=("$impl=$base.raw.csv")
        else
            echo "$config $impl: ncu failed, see $base.log" >&2
        fi
        rm -f "$base.ncu-rep"
    done
    if (( ${#columns[@]} )); then
        python3 scripts/ncu_pipes.py "${columns[@]}" | tee "$out/$config.pipes.md"
    fi
done
