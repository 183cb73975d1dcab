# Sourced by scripts/ncu_backward.sh and ncu_stalls.sh: which implementations run without the
# dQ order. NONDET unset or empty: both deterministic; NONDET=1: both without it; NONDET=fa3:
# FA3's atomic backward beside dashgen's deterministic one, the pair the speed bars compare.
case ${NONDET:-} in
    ""|1|fa3) ;;
    *) echo "NONDET must be empty, 1 or fa3, got '$NONDET'" >&2; exit 2;;
esac

# nondet_flag IMPL: prints ncu_backward.py's --nondeterministic where IMPL runs without the order.
nondet_flag() {
    if [[ ${NONDET:-} == 1 || ( ${NONDET:-} == fa3 && $1 == fa3 ) ]]; then
        echo --nondeterministic
    fi
}
