# ring_lib.sh — tests/lib.sh in the mode the ring integration tests (tests/test-ring-*.sh)
# want: the first failure stops the script and shows the tail of every stage's log, and a
# sanitizer report in any stage log (ASan builds) fails it. The helpers (ring_up, ring_down,
# rank_pid, rank_port, RINGS, EXTRA_PIDS, TMP, ...) are lib.sh's.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fail_fast
san_log_check

on_fatal() {
    local d l
    for d in $RINGS; do
        for l in "$d"/rank-*/kvd.log; do [ -f "$l" ] && { echo "--- $l"; tail -n 15 "$l"; }; done
    done
}
