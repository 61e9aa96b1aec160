#!/bin/bash
# Numbers in control requests are range-checked before any conversion: a generate request
# whose seed, top_k, repeat_last_n, n, temp, top_p ... is out of range, not an integer where
# one is needed, infinite or not a number gets an error naming the field, the value and the
# range; the daemon keeps serving, and (in the ASan+UBSan build) no sanitizer report appears
# in a stage log. A seed of 2^64 (what "--seed -1" becomes as a JSON double) still works.
. "$(dirname "$0")/../lib/ring_lib.sh"
need_exec "$KVCTL" "$KVD"
M=$(need_model stories260K.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 2
wait_linked "$D" 2 20 || fail "ring did not link"
PID0=$(rank_pid "$D" 0)

# req JSON: one request line to rank 0's control socket; prints the reply lines.
req() {
    python3 - "$D/rank-0/kvd.sock" "$1" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(20)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\n")
out = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    out += b
sys.stdout.write(out.decode(errors="replace"))
PY
}

# bad FIELD VALUE EXPECT: the reply is an error naming FIELD and EXPECT; rank 0 still runs.
bad() {
    local out
    local n='"n":2,'
    [ "$1" = n ] && n=
    out=$(req "{\"op\":\"generate\",\"tokens\":[1,2],$n\"$1\":$2}") || fail "$1=$2: no reply"
    echo "$out" | grep -q "\"error\":\"$1: .*$3" || fail "$1=$2: reply '$out' lacks '$1: ... $3'"
    kill -0 "$PID0" 2>/dev/null || fail "$1=$2: rank 0 died"
    echo "ok $1=$2: $(echo "$out" | head -c 160)"
}
bad seed 1e30 "1e+30 out of range; an integer in \[0, 18446744073709551616\]"
bad seed -1 "out of range; an integer in \[0, 18446744073709551616\]"
bad seed 1.5 "1.5 out of range; an integer"
bad top_k 1e10 "10000000000 out of range; an integer in \[0, 2147483647\]"
bad top_k -3 "-3 out of range"
bad repeat_last_n 1e300 "out of range; an integer in \[0, 1048576\]"
bad repeat_last_n -5 "-5 out of range"
bad n 1e20 "out of range; an integer in \[0, 4294967295\]"
bad n -1 "-1 out of range"
bad temp 1e999 "inf out of range; a number in \[-1000, 1000\]"
bad temp -1e999 "-inf out of range"
bad top_p 2 "2 out of range; a number in \[0, 1\]"
bad min_p -0.5 "out of range"
bad repeat_penalty 0 "0 out of range"
bad freq_penalty 1e40 "out of range"
bad presence_penalty -1e40 "out of range"
bad top_k '"many"' "not a number"

# The daemon still serves: a generation with every number at an edge of its range.
out=$(req '{"op":"generate","tokens":[1,2,3],"n":3,"seed":18446744073709551616,"temp":0.8,"top_k":2147483647,"top_p":1,"min_p":0,"repeat_last_n":1048576,"repeat_penalty":1.1,"freq_penalty":-1000,"presence_penalty":1000}')
echo "$out" | grep -q '"error"' && fail "edge values refused: $out"
echo "$out" | grep -q '"done"\|"reason"' || fail "no end of generation: $out"
"$KVCTL" generate --ring "$D" --tokens 1,2,3 -n 3 --seed -1 --temp 0.7 > "$T/gen" 2>&1 ||
    fail "kvctl generate --seed -1: $(cat "$T/gen")"
kill -0 "$PID0" 2>/dev/null || fail "rank 0 died"
echo "ok the daemon serves after hostile numbers; --seed -1 works"

finish
