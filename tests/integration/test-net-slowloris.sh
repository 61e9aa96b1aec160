#!/bin/bash
# test-net-slowloris.sh — connections that stop talking cannot hold the seeder or the relay
# (plain and TLS). The attacker (tests/lib/http_attack.py, from 127.0.0.2) opens more
# connections than its per-address cap and stalls them: after a request head that announces
# a body, inside a request head, right after connecting, or halfway into a TLS handshake.
# Every attack connection must be closed within its deadline (refused at once over the cap),
# the target's counters must say so, and a legitimate client on 127.0.0.1 is served during
# the attack and after it.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVD"
M=$(need_model stories260K.gguf) || exit 1
A="python3 tests/lib/http_attack.py"
# check FILE EXPR MSG...: the checks of http_attack.py on a JSON result; a failure is counted
check() { local out; out=$($A check "$@") || fail "$out"; }

# ---- the seeder: deadlines 500 ms, 20 connections per address
"$KVD" seeder --serve "$M" --listen 127.0.0.1:0 --port-file "$T/seed.port" --header-timeout 500 \
    --body-timeout 500 --idle-timeout 3000 --max-conns 200 --max-conns-per-addr 20 \
    2> "$T/seeder.log" &
PIDS="$PIDS $!"
wait_file "$T/seed.port" || die "seeder did not start: $(cat "$T/seeder.log")"
SP=$(cat "$T/seed.port")
legit_seed() { [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$SP/v1/models")" = 200 ]; }

# max_close_s is timed by the attacker from its connect, so a loaded machine adds its accept
# delay: the bound is 2.5 s, room for that yet under the 3 s idle timeout that would otherwise
# be the one to close them.
for mode in body head connect; do
    $A stall --port "$SP" --src 127.0.0.2 -n 60 --mode $mode --wait 4 > "$T/seed-$mode.json" &
    ap=$!
    sleep 0.5
    legit_seed || fail "seeder: a legitimate GET during the $mode attack was not answered"
    wait $ap
    echo "seeder, stall after $mode: $(cat "$T/seed-$mode.json")"
    check "$T/seed-$mode.json" \
        'd["closed"] + d["refused_at_connect"] == 60' "seeder: not every stalled connection ($mode) was closed" \
        'd["max_close_s"] < 2.5' "seeder: a stalled connection ($mode) lived past its 500 ms deadline"
done
legit_seed || fail "seeder: a legitimate GET after the attacks was not answered"
curl -s "http://127.0.0.1:$SP/v1/seeder/stats" > "$T/seed-stats.json"
echo "seeder stats: $(cat "$T/seed-stats.json")"
check "$T/seed-stats.json" \
    'd["conns_refused_addr"] >= 100' "seeder: connections over the per-address cap were not refused" \
    'd["timeouts"]["body"] >= 15 and d["timeouts"]["header"] >= 30' "seeder: body and header deadlines not counted" \
    'd["conns_open"] <= 2' "seeder: connections still open after the attacks"
n=$(grep -c "refused connection from 127.0.0.2" "$T/seeder.log")
[ "$n" -ge 1 ] && [ "$n" -le 12 ] || fail "seeder: $n log lines for refusals (want 1..12: rate-limited)"
grep -q "similar lines left out" "$T/seeder.log" || fail "seeder: the log does not count the lines it left out"

# ---- the relay, plain and TLS: the same stalls count against its per-address cap
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$T/key.pem" -out "$T/cert.pem" >/dev/null 2>&1
for tls in plain tls; do
    if [ $tls = plain ]; then opt=(--plain); sch=http; topt=(); else
        opt=(--tls-cert "$T/cert.pem" --tls-key "$T/key.pem"); sch=https; topt=(--tls); fi
    "$KVD" --role relay --listen 127.0.0.1:0 "${opt[@]}" --header-timeout 500 --max-per-addr 5 \
        2> "$T/relay-$tls.log" &
    PIDS="$PIDS $!"
    wait_for 10 grep -q "listening on" "$T/relay-$tls.log" || die "relay ($tls) did not start"
    RP=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$T/relay-$tls.log" | head -1)
    modes="body head connect"
    [ $tls = tls ] && modes="connect tls-half"
    for mode in $modes; do
        $A stall --port "$RP" --src 127.0.0.2 -n 80 --mode $mode --wait 4 > "$T/relay-$tls-$mode.json" &
        ap=$!
        sleep 0.5
        [ "$(curl -sk -o /dev/null -w '%{http_code}' --max-time 3 "$sch://127.0.0.1:$RP/healthz")" = 200 ] ||
            fail "relay ($tls): a legitimate GET during the $mode attack was not answered"
        $A pair --port "$RP" "${topt[@]}" --msgs 5 --size 2000 |
            check - 'd["ok"]' "relay ($tls): a legitimate bridge during the $mode attack failed"
        wait $ap
        echo "relay ($tls), stall after $mode: $(cat "$T/relay-$tls-$mode.json")"
        check "$T/relay-$tls-$mode.json" \
            'd["closed"] + d["refused_at_connect"] == 80' "relay ($tls): not every stalled connection ($mode) was closed" \
            'd["max_close_s"] < 2.5' "relay ($tls): a stalled connection ($mode) lived past its 500 ms deadline"
    done
    curl -sk "$sch://127.0.0.1:$RP/v1/relay/status" > "$T/relay-$tls.json"
    echo "relay ($tls) status: $(cat "$T/relay-$tls.json")"
    check "$T/relay-$tls.json" \
        'd["http"]["refused_addr"] >= 50 and d["http"]["timeouts"] >= 20' "relay ($tls): refusals and timeouts not counted in its status" \
        'd["http"]["connections"] <= 2' "relay ($tls): connections still open after the attacks"
    $A pair --port "$RP" "${topt[@]}" --msgs 5 --size 2000 |
        check - 'd["ok"]' "relay ($tls): a bridge after the attacks failed"
done
finish
