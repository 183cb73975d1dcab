#!/usr/bin/env bash
# Warp-stall sampling per SASS instruction of the forward's attention kernel, dashgen's beside
# SDPA cuDNN's, per configuration: one report of the forward call (scripts/ncu_forward.py; its
# first kernel launch, the attention kernel in both), its source and raw pages as CSV, the
# tables of scripts/ncu_sass.py and the SpeedOfLight / WarpStateStats details side by side
# (scripts/ncu_compare.py). On the H200, from the project root:
#
#   bash scripts/ncu_forward_stalls.sh OUT_DIR d64-full-4096 d128-full-16384 ...
#
# writes OUT_DIR/<config>.<impl>.ncu-rep, .sass.csv, .raw.csv, .details.csv, .log and
# OUT_DIR/<config>.md.
set -euo pipefail
if (( $# < 2 )); then
    echo "usage: bash scripts/ncu_forward_stalls.sh OUT_DIR CONFIG [CONFIG ...]" >&2
    echo "  CONFIG: d<head dim>-<full|causal>-<seqlen>, e.g. d64-full-4096" >&2
    exit 2
fi
out=$1; shift
mkdir -p "$out"
sections=(--section WarpStateStats --section SourceCounters --section SpeedOfLight
          --section ComputeWorkloadAnalysis)
for config in "$@"; do
    IFS=- read -r dim mask seqlen <<<"$config"
    reports=()
    details=()
    for impl in dashgen cudnn; do
        base=$out/$config.$impl
        rc=0
        rm -f "$base.ncu-rep"
        ncu --profile-from-start off --clock-control none --launch-count 1 "${sections[@]}" \
            --import-source no -o "$base" \
            python3 scripts/ncu_forward.py --impl "$impl" --head-dim "${dim#d}" --mask "$mask" \
            --seqlen "$seqlen" > "$base.log" 2>&1 || rc=$?
        if (( rc )) || [[ ! -f $base.ncu-rep ]]; then
            echo "$config $impl: ncu exited $rc or wrote no report, see $base.log" >&2
            continue
        fi
        ncu -i "$base.ncu-rep" --page details --csv > "$base.details.csv" 2>> "$base.log" &&
            details+=("$impl=$base.details.csv")
        if ncu -i "$base.ncu-rep" --page source --csv --print-source sass \
                > "$base.sass.csv" 2>> "$base.log" &&
           ncu -i "$base.ncu-rep" --page raw --csv > "$base.raw.csv" 2>> "$base.log"; then
            reports+=("$impl=$base")
        else
            echo "$config $impl: no source or raw page, see $base.log" >&2
        fi
    done
    {
        (( ${#details[@]} )) && python3 scripts/ncu_compare.py "${details[@]}"
        echo
        (( ${#reports[@]} )) && python3 scripts/ncu_sass.py "${reports[@]}"
    } > "$out/$config.md" || echo "$config: tables incomplete (see the messages above)" >&2
done
