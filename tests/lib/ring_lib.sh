# ring_lib.sh — tests/lib/lib.sh in the mode the ring integration tests (tests/integration/test-ring-*.sh)
# want: the first failure stops the script and shows the tail of every stage's log, and a
# sanitizer report in any stage log (ASan builds) fails it. The helpers (ring_up, ring_down,
# rank_pid, rank_port, RINGS, EXTRA_PIDS, TMP, ...) are lib.sh's.
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
fail_fast
san_log_check

on_fatal() {
    local d l
    for d in $RINGS; do
        for l in "$d"/rank-*/kvd.log "$d"/standby-*/kvd.log; do [ -f "$l" ] && { echo "--- $l"; tail -n 15 "$l"; }; done
    done
    # then a test's own helpers' output (a proxy's, an attacker's), when it defines it
    if declare -F on_fatal_extra > /dev/null; then on_fatal_extra; fi
}

# Repair helpers (docs/ring.md, "Repair"):
# serving_pid DIR R: the pid of the kvd that serves rank R in the linked ring now (its own node
# or a standby)
serving_pid() {
    "$KVCTL" status --ring "$1" --json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    o = json.loads(l)
    if o.get("rank") == int(sys.argv[1]) and o.get("linked"):
        print(o["pid"]); break' "$2"
}
# ring_sessions DIR: sessions held on every node of the ring that answers (ranks, standbys)
ring_sessions() {
    "$KVCTL" status --ring "$1" --json 2>/dev/null | python3 -c '
import json, sys
print(sum(json.loads(l).get("sessions", 0) for l in sys.stdin))'
}
# ring_idle DIR: no node of the ring holds a session (for wait_for: the command runs anew
# each poll, where `wait_for N test "$(ring_sessions D)" = 0` would test one old figure)
ring_idle() { [ "$(ring_sessions "$1")" = 0 ]; }
# rank0_repair DIR KEY: a figure of rank 0's status "repair" object
rank0_repair() {
    "$KVCTL" status --ring "$1" --json 2>/dev/null | sed -n 1p | python3 -c '
import json, sys
print(json.load(sys.stdin)["repair"][sys.argv[1]])' "$2"
}
# kill_measure PID DELAY_MS CLIENT_PID:OUT_FILE:ERR_FILE...: once every client wrote its first
# bytes, wait DELAY_MS, SIGKILL PID, then print the milliseconds until every client running at
# the kill has said on stderr that it resumed (the note comes with its next token) or ended,
# and how many were running ("MS N"). With KILL_RESTART=DIR (the node's directory, holding
# kvd.cmdline from node_cmdline), the node is started again right after the kill, as before;
# KILL_SIGNAL=STOP stops it instead (tests/lib/ring_kill.py).
kill_measure() { python3 "$ROOT/tests/lib/ring_kill.py" "$@"; }
# draft_field DIR RANK KEY: a figure of RANK's "drafts" status object
draft_field() {
    "$KVCTL" status --ring "$1" --json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    o = json.loads(l)
    if o.get("rank") == int(sys.argv[1]) and o.get("linked"):
        print(o["drafts"][sys.argv[2]]); break' "$2" "$3"
}
# clients_as_one ONE OUT: each client of CLIENT_PIDS, the i-th, ended well and wrote OUT.i (its
# stderr OUT.err.i) equal to ONE.i, what one process wrote; fails the test naming the first not.
clients_as_one() {
    local i=0 p
    for p in $CLIENT_PIDS; do
        wait "$p" || fail "session $i failed after the kill: $(cat "$2.err.$i")"
        cmp -s "$1.$i" "$2.$i" || fail "session $i differs from one process after the kill:
ring: $(cat "$2.$i")
one:  $(cat "$1.$i")
stderr: $(cat "$2.err.$i")"
        i=$((i + 1))
    done
}
# kill_during SOCK PID MAX_DELAY_MS SIGNAL START: the function START starts clients (setting
# CLIENT_PIDS and CLIENT_ARGS, PID:OUT_FILE:ERR_FILE ...) and kill_measure sends PID SIGNAL
# (KILL, STOP) a random delay below MAX_DELAY_MS after every client wrote its first bytes,
# sessions opened on rank 0's control socket SOCK counting. On a loaded machine the last
# client may start when the others have ended: then nothing is signalled, the clients are
# waited for and it starts again (3 tries, the later ones without delay). Sets KILL_MS, the
# time to every running client's next token, and KILL_RUNNING, the clients running at the kill
# (> 0: it fails the test otherwise).
kill_during() {
    local sock=$1 pid=$2 maxd=$3 sig=$4 start=$5 spec km attempt
    for attempt in 1 2 3; do
        spec=$(mktemp "$TMP/kill.XXXXXX") && rm -f "$spec"
        KILL_OPEN_SOCK=$sock KILL_NEED_RUNNING=1 KILL_SIGNAL=$sig \
            kill_measure "$pid" $((attempt == 1 ? RANDOM % maxd : 0)) "@$spec" > "$spec.km" &
        km=$!
        CLIENT_PIDS="" CLIENT_ARGS=""
        "$start"
        EXTRA_PIDS="$EXTRA_PIDS $CLIENT_PIDS $km"
        echo "$CLIENT_ARGS" > "$spec.tmp" && mv "$spec.tmp" "$spec"
        wait "$km" || fail "the kill's stopwatch failed"
        read -r KILL_MS KILL_RUNNING < "$spec.km"
        [ "$KILL_RUNNING" -gt 0 ] && return 0
        wait $CLIENT_PIDS
        echo "note: every session had ended before the kill could fall; again"
    done
    fail "no session was running at the kill (the test's timing)"
}
# node_cmdline PID: the command line of a running kvd, one argument a line (to start it again)
node_cmdline() { tr '\0' '\n' < "/proc/$1/cmdline"; }
