#!/usr/bin/env bash
# Warp-stall sampling per SASS instruction of the backward's main kernel, dashgen's beside
# FA3's, per configuration: one report of that kernel alone (scripts/ncu_backward.py runs the
# backward), its source page (per-instruction samples) and raw page (the sample totals per stall
# reason) as CSV, and the tables of scripts/ncu_sass.py. The small pre/post kernels are left
# out by name: dashgen's end in _preprocess / _convert after the det|nondet flags; FA3's three
# kernels are all cutlass::device_kernel<...>, so its main one is matched on the demangled name.
# Needs the anchor kit's FA3 build (FA3 defaults to /tmp/anchors/fa3/hopper). On the H200, from
# the project root:
#
#   bash scripts/ncu_stalls.sh OUT_DIR d64-causal-8192 d128-full-4096 ...
#   NONDET=1 / NONDET=fa3 bash scripts/ncu_stalls.sh ...  # as in scripts/ncu_backward.sh
#
# writes OUT_DIR/<config>.<impl>.ncu-rep, .sass.csv, .raw.csv, .log and OUT_DIR/<config>.md.
set -euo pipefail
source "$(dirname "$0")/ncu_nondet.sh"
if (( $# < 2 )); then
    echo "usage: bash scripts/ncu_stalls.sh OUT_DIR CONFIG [CONFIG ...]" >&2
    echo "  CONFIG: d<head dim>-<full|causal>-<seqlen>, e.g. d64-causal-8192" >&2
    exit 2
fi
out=$1; shift
fa3=${FA3_PATH:-/tmp/anchors/fa3/hopper}
mkdir -p "$out"
sections=(--section WarpStateStats --section SourceCounters --section SpeedOfLight)
# dashgen's main kernel: its variant's name, det|nondet, then the optional flags in their order
# (dashgen/codegen/variants.py), spelled out so that the pattern needs no lookahead to leave
# <name>_preprocess and <name>_convert out.
flags='(_gqa)?(_fconv)?(_ekv)?(_trace)?(_varlen)?'
declare -A kernel=([dashgen]="regex:^dashgen_bwd_[a-z0-9_]*det$flags\$"
                   [fa3]=regex:FlashAttnBwdSm90)
declare -A name_base=([dashgen]=function [fa3]=demangled)
declare -A label=([dashgen]=dashgen [fa3]=FA3)
for config in "$@"; do
    IFS=- read -r dim mask seqlen <<<"$config"
    reports=()
    for impl in dashgen fa3; do
        base=$out/$config.$impl
        rc=0
        rm -f "$base.ncu-rep"  # a kernel filter that matches nothing writes no report
        ncu --profile-from-start off --clock-control none \
            --kernel-name-base "${name_base[$impl]}" --kernel-name "${kernel[$impl]}" \
            --launch-count 1 "${sections[@]}" --import-source no -o "$base" \
            python3 scripts/ncu_backward.py --impl "$impl" --fa3-path "$fa3" \
            --head-dim "${dim#d}" --mask "$mask" --seqlen "$seqlen" $(nondet_flag "$impl") \
            > "$base.log" 2>&1 || rc=$?
        if (( rc )) || [[ ! -f $base.ncu-rep ]]; then
            echo "$config $impl: ncu exited $rc or wrote no report, see $base.log" >&2
            continue
        fi
        if ! ncu -i "$base.ncu-rep" --page source --csv --print-source sass \
            > "$base.sass.csv" 2>> "$base.log"; then
            echo "$config $impl: no source page, see $base.log" >&2
            continue
        fi
        if ! ncu -i "$base.ncu-rep" --page raw --csv > "$base.raw.csv" 2>> "$base.log"; then
            echo "$config $impl: no raw page, see $base.log" >&2
            continue
        fi
        reports+=("${label[$impl]}=$base")
    done
    if (( ${#reports[@]} == 0 )); then
        echo "$config: no report, no tables" >&2
        continue
    fi
    python3 scripts/ncu_sass.py "${reports[@]}" > "$out/$config.md" ||
        echo "$config: no tables (see the message above)" >&2
done
