# e2e_verify_lib.sh - sourced by the e2e scripts of the references (e2e_ref_tiny, e2e_ref_tiny_fp8, e2e_ref_topk512,
# e2e_ref_gpu); needs BIN (the dsv4 command).
#   verify_all [--no-tie] ARGS... GOLDEN CANDIDATE
# `dsv4 verify --no-color ARGS... GOLDEN CANDIDATE` passes AND the candidate holds every probe of the golden (the
# verifier lists a dataset missing from the candidate as "only in golden" without failing on it); --no-tie: and
# no tie-accepted top-k pick. Prints the report; returns 0 or 1.
verify_all() {
    local no_tie=0 out rc
    [ "$1" = --no-tie ] && { no_tie=1; shift; }
    out=$("$BIN" verify --no-color "$@" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    [ $rc -eq 0 ] || return 1
    case $out in *"only in golden"*) echo "a probe of the golden is missing from the candidate"; return 1 ;; esac
    if [ $no_tie = 1 ]; then
        case $out in *"first tie-accepted top-k difference"*) echo "a tie where none may be"; return 1 ;; esac
    fi
    return 0
}
