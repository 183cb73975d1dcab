#!/usr/bin/env bash
# dashgen's backward beside FA3's under the same Nsight Compute sections, per configuration
# (lab/ncu_backward.py), and the side-by-side table of their main kernels (lab/ncu_compare.py).
# Needs the anchor kit's FA3 build (ANCHOR_MODE=build, with HDIM96/192/256 for those head dims;
# FA3_PATH defaults to /tmp/anchors/fa3/hopper). On an sm_90 GPU, from the project root:
#
#   bash lab/ncu_backward.sh OUT_DIR d256-full-16384 d64-causal-8192 ...
#   NONDET=1 bash lab/ncu_backward.sh ...    # both without the dQ order (FA3's atomic dQ)
#   NONDET=fa3 bash lab/ncu_backward.sh ...  # FA3's atomic backward beside dashgen's
#                                            # deterministic one (the pair the bars compare;
#                                            # at 256 FA3 has no deterministic backward)
#
# writes OUT_DIR/<config>.<impl>.csv (ncu's details page), .log, and OUT_DIR/<config>.md.
set -euo pipefail
case ${NONDET:-} in
    ""|1|fa3) ;;
    *) echo "NONDET must be empty, 1 or fa3, got '$NONDET'" >&2; exit 2;;
esac
if (( $# < 2 )); then
    echo "usage: bash lab/ncu_backward.sh OUT_DIR CONFIG [CONFIG ...]" >&2
    echo "  CONFIG: d<head dim>-<full|causal>-<seqlen>, e.g. d256-full-16384" >&2
    exit 2
fi
# --nondeterministic where IMPL runs without the dQ order.
nondet_flag() {
    if [[ ${NONDET:-} == 1 || ( ${NONDET:-} == fa3 && $1 == fa3 ) ]]; then
        echo --nondeterministic
    fi
}
here=$(dirname "$0")
out=$1; shift
fa3=${FA3_PATH:-/tmp/anchors/fa3/hopper}
mkdir -p "$out"
sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis
          --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats
          --section InstructionStats)
# The L2's bytes by kind (reads, writes, reductions, atomics): at head_dim 256 the L2 bounds the
# backward, and these say which of a task's transfers fill it (lab/notes/tried-and-dropped.md `pair-stores`).
metrics=(--metrics "lts__t_bytes.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum")
for config in "$@"; do
    IFS=- read -r dim mask seqlen <<<"$config"
    for impl in dashgen fa3; do
        ncu --profile-from-start off --clock-control none "${sections[@]}" "${metrics[@]}" --csv \
            --page details python3 "$here/ncu_backward.py" --impl "$impl" --fa3-path "$fa3" \
            --head-dim "${dim#d}" --mask "$mask" --seqlen "$seqlen" \
            $(nondet_flag "$impl") \
            > "$out/$config.$impl.csv" 2> "$out/$config.$impl.log" ||
            echo "$config $impl: ncu exited $?, see $out/$config.$impl.log" >&2
    done
    python3 "$here/ncu_compare.py" "dashgen=$out/$config.dashgen.csv" \
        "FA3=$out/$config.fa3.csv" > "$out/$config.md" ||
        echo "$config: no table (a report without kernels)" >&2
done
