#!/usr/bin/env bash
# FA3's deterministic backward beside dashgen's under the same Nsight Compute sections, per
# configuration (scripts/ncu_backward.py), and the side-by-side table of their main kernels
# (scripts/ncu_compare.py). Needs the anchor kit's FA3 build (ANCHOR_MODE=build; FA3 defaults
# to /tmp/anchors/fa3/hopper). On the H200, from the project root:
#
#   bash scripts/ncu_backward.sh OUT_DIR d64-causal-8192 d64-full-4096 ...
#   NONDET=1 bash scripts/ncu_backward.sh ...   # both without the dQ order (FA3's atomic dQ)
#   NONDET=fa3 bash scripts/ncu_backward.sh ... # FA3's atomic backward beside dashgen's
#                                               # deterministic one (the pair the bars compare)
set -euo pipefail
source "$(dirname "$0")/ncu_nondet.sh"
out=$1; shift
fa3=${FA3_PATH:-/tmp/anchors/fa3/hopper}
mkdir -p "$out"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
          --section InstructionStats)
for config in "$@"; do
    IFS=- read -r dim mask seqlen <<<"$config"
    for impl in dashgen fa3; do
        ncu --profile-from-start off --clock-control none "${sections[@]}" --csv \
            --page details python3 scripts/ncu_backward.py --impl "$impl" --fa3-path "$fa3" \
            --head-dim "${dim#d}" --mask "$mask" --seqlen "$seqlen" \
            $(nondet_flag "$impl") \
            > "$out/$config.$impl.csv" 2> "$out/$config.$impl.log" ||
            echo "$config $impl: ncu exited $?, see $out/$config.$impl.log" >&2
    done
    python3 scripts/ncu_compare.py "dashgen=$out/$config.dashgen.csv" \
        "FA3=$out/$config.fa3.csv" > "$out/$config.md" ||
        echo "$config: no table (a report without kernels)" >&2
done
