#!/bin/bash
# test-kvd-service: kvd as a systemd service, without systemd running here (no PID 1
# manager in this sandbox): `make install` into a DESTDIR places binaries, unit, config and
# docs; the unit passes `systemd-analyze verify` and `systemd-analyze security` rates it OK or
# better; kvd is started with the unit's own ExecStart line (paths pointed at this build),
# with a stand-in notification socket and the journal's stream variable set as systemd sets
# them, and its listening socket handed over as a kvd.socket unit would: it serves on that
# socket, says READY=1 with its rank, logs without timestamps of its own (syslog priority
# prefixes), reloads its config on SIGHUP (log level at once, other changes named, a broken
# file keeps the running settings), and on SIGTERM says STOPPING=1 and exits 0. Started from
# a terminal (a shell or adb session), SIGHUP is a hang-up: a clean stop. The config file's
# errors name file, line and key.
. "$(dirname "$0")/../lib/lib.sh"
M=$DATA/models/stories260K.gguf
need_data "$M"
need_exec "$B/kvd" "$B/kvctl"
command -v systemd-analyze > /dev/null || die "systemd-analyze missing (Debian package systemd)"
K=$KVCTL
check() { if eval "$2"; then echo "ok   $1"; else fail "$1"; fi; }
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
at_exit cleanup

# 1. make install into a DESTDIR
make -s install DESTDIR="$T/root" PREFIX=/usr B="$B" > "$T/install.txt" 2>&1
check "make install places kvd, kvctl, the unit, the config, the docs" \
    '[ -x "$T/root/usr/bin/kvd" ] && [ -x "$T/root/usr/bin/kvctl" ] && [ -f "$T/root/usr/lib/systemd/system/kvd.service" ] && [ -f "$T/root/etc/kvd/kvd.conf" ] && [ -f "$T/root/usr/share/doc/kvasir/service.md" ]'
check "installed unit runs /usr/bin/kvd --config /etc/kvd/kvd.conf" 'grep -qx "ExecStart=/usr/bin/kvd --config /etc/kvd/kvd.conf" "$T/root/usr/lib/systemd/system/kvd.service"'
echo "log-level = debug" >> "$T/root/etc/kvd/kvd.conf"
make -s install DESTDIR="$T/root" PREFIX=/usr B="$B" > /dev/null 2>&1
check "a second install keeps the operator's config" 'grep -q "log-level = debug" "$T/root/etc/kvd/kvd.conf"'
make -s uninstall DESTDIR="$T/root" PREFIX=/usr > /dev/null 2>&1
check "uninstall removes binaries and unit, keeps the config" '[ ! -e "$T/root/usr/bin/kvd" ] && [ ! -e "$T/root/usr/lib/systemd/system/kvd.service" ] && [ -f "$T/root/etc/kvd/kvd.conf" ]'

# 2. the unit, pointed at this build and this test's config dir
mkdir -p "$T/etc/kvd" "$T/state"
sed -e "s|@BINDIR@|$(cd "$B" && pwd)|g" -e "s|@SYSCONFDIR@|$T/etc|g" -e "s|@DOCDIR@|$PWD/docs|g" \
    contrib/kvd.service.in > "$T/kvd.service"
systemd-analyze verify "$T/kvd.service" > "$T/verify.txt" 2>&1
check "systemd-analyze verify passes" '[ $? -eq 0 ] && [ ! -s "$T/verify.txt" ] || { cat "$T/verify.txt"; false; }'
systemd-analyze security --offline=true "$T/kvd.service" > "$T/security.txt" 2>&1
level=$(sed -n 's/.*Overall exposure level for kvd.service: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p' "$T/security.txt")
echo "     systemd-analyze security: $level"
check "systemd-analyze security rates the unit OK or better" 'case "${level#* }" in PERFECT|SAFE|OK) true ;; *) false ;; esac'

# 3. kvd from the unit's ExecStart, as systemd would start it, its listening socket handed
# over as a kvd.socket unit would (LISTEN_FDS; tests/lib/listen.py binds it first)
# every device pinned by its node key (b and c run no kvd here: keys of their own state dirs,
# endpoints nobody listens on)
for d in a b c; do
    mkdir -p "$T/node-$d"
    eval "KEY_$d=\$("$B/kvd" stage --print-key --state-dir "$T/node-$d")"
done
cat > "$T/devs.json" <<JSON
{"devices":[
 {"id":"a","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$(free_port)","node":"$KEY_a"},
 {"id":"b","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$(free_port)","node":"$KEY_b"},
 {"id":"c","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$(free_port)","node":"$KEY_c"}]}
JSON
plan() {
    "$K" plan --model "$M" --devices "$T/devs.json" --ctx 256 --sessions 1 --headroom 0 -o "$T/state/ring.json" > /dev/null 2>&1 ||
        die "plan failed"
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][0]["device"])' "$T/state/ring.json"
}
dev0=$(plan)   # which device the plan makes rank 0
cp "$T/node-$dev0/node.key" "$T/state/"   # rank 0 runs as the device planned for it
cat > "$T/etc/kvd/kvd.conf" <<CONF
# a stage of a planned ring
role = stage
manifest = $T/state/ring.json
rank = 0
model = "$M"
state-dir = $T/state
log-level = info
CONF
exec_start=$(sed -n 's/^ExecStart=//p' "$T/kvd.service")
python3 tests/lib/notify_listen.py "$T/notify.sock" "$T/notify.txt" &
pids="$pids $!"
wait_for 10 grep -qs listening "$T/notify.txt" || die "notification listener did not start"
# stderr is the "journal": JOURNAL_STREAM names its device and inode
: > "$T/journal.log"
js=$(stat -c '%d:%i' "$T/journal.log")
# setsid: no controlling terminal, as under systemd; it starts once the plan names its port
# shellcheck disable=SC2086
"$LISTEN" --wait "$T/go" "$T/rank0.port" 0 -- \
    env NOTIFY_SOCKET="$T/notify.sock" JOURNAL_STREAM="$js" setsid $exec_start >> "$T/journal.log" 2>&1 &
kpid=$!
pids="$pids $kpid"
P0=$(port_of "$T/rank0.port") || die "the socket's launcher failed"
python3 - "$T/devs.json" "$dev0" "$P0" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for x in d["devices"]:
    if x["id"] == sys.argv[2]:
        x["endpoint"] = "tcp://127.0.0.1:" + sys.argv[3]
json.dump(d, open(sys.argv[1], "w"))
PY
[ "$(plan)" = "$dev0" ] || die "the plan moved rank 0 when its port changed"
touch "$T/go"
wait_for 20 grep -qs "STATUS=rank 0 of 3" "$T/notify.txt"   # READY=1 comes first, in the same datagram
check "READY=1 once the stage listens, with its rank in STATUS" 'grep -q "READY=1" "$T/notify.txt" && grep -q "STATUS=rank 0 of 3" "$T/notify.txt"'
check "it serves on the socket handed over (port $P0, LISTEN_FDS)" 'grep -q "listening on 127.0.0.1:$P0 (port $P0)" "$T/journal.log"'
check "journal lines: syslog priority, no timestamp of its own" 'grep -q "^<6>INFO" "$T/journal.log" && ! grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T" "$T/journal.log"'
# reload: the log level at once, another change named as waiting for a restart
sed -i 's/^log-level = info/log-level = debug/; s/^rank = 0/rank = 0\nidle-timeout = 60/' "$T/etc/kvd/kvd.conf"
kill -HUP "$kpid"
wait_for 5 grep -q "config reloaded" "$T/journal.log"
# the notifications reach the listener (another process) on their own time: wait for them
reloaded() { grep -q "RELOADING=1" "$T/notify.txt" && [ "$(grep -c READY=1 "$T/notify.txt")" -ge 2 ]; }
wait_for 10 reloaded
check "SIGHUP reloads: RELOADING=1 then READY=1, the process stays" 'grep -q "RELOADING=1" "$T/notify.txt" && [ "$(grep -c READY=1 "$T/notify.txt")" -ge 2 ] && kill -0 $kpid'
check "the new log level applies, a changed key is named for restart" 'grep -q "log level debug" "$T/journal.log" && grep -q "idle-timeout changed (line" "$T/journal.log"'
echo "bogus-key = 1" >> "$T/etc/kvd/kvd.conf"
kill -HUP "$kpid"
wait_for 5 grep -q "running configuration is kept" "$T/journal.log"
check "a broken config on reload is named and the running settings kept" 'grep -q "kvd.conf:[0-9]*: unknown key .bogus-key." "$T/journal.log" && kill -0 $kpid'
kill -TERM "$kpid"
wait "$kpid"
rc=$?
wait_for 10 grep -q "STOPPING=1" "$T/notify.txt"
check "SIGTERM: STOPPING=1 and exit status 0" '[ $rc -eq 0 ] && grep -q "STOPPING=1" "$T/notify.txt"'

# 4. from a terminal (an adb shell, a login) SIGHUP is a hang-up: a clean stop
sed -i '/bogus-key/d' "$T/etc/kvd/kvd.conf"
script -qfec "$B/kvd --config $T/etc/kvd/kvd.conf" "$T/tty.log" > /dev/null 2>&1 &
spid=$!
pids="$pids $spid"
wait_for 20 grep -q "listening on" "$T/tty.log"
kpid2=$(pgrep -f -n "kvd --config $T/etc/kvd/kvd.conf" | grep -v "^$spid\$" | tail -1)
[ -n "$kpid2" ] && kill -HUP "$kpid2"
wait_for 10 grep -q "shutting down: SIGHUP" "$T/tty.log"
check "on a terminal SIGHUP stops kvd cleanly" 'grep -q "shutting down: SIGHUP (hang-up)" "$T/tty.log"'

# 5. config errors name file, line and key; the command line wins over the file
conf() { printf '%b' "$1" > "$T/bad.conf"; "$B/kvd" --config "$T/bad.conf" --print-key > "$T/bad.out" 2>&1; echo $?; }
check "unknown key: line and key named" '[ "$(conf "role = stage\\n\\nfrob = 1\\n")" = 2 ] && grep -q "bad.conf:3: unknown key .frob." "$T/bad.out"'
check "duplicate key: both lines named" '[ "$(conf "rank = 1\\nrank = 2\\n")" = 2 ] && grep -q "bad.conf:2: key .rank. again (first set on line 1)" "$T/bad.out"'
check "no value: named" '[ "$(conf "manifest =\\n")" = 2 ] && grep -q "bad.conf:1: key .manifest. needs a value" "$T/bad.out"'
check "a switch takes true/false" '[ "$(conf "foreground = maybe\\n")" = 2 ] && grep -q "bad.conf:1: key .foreground. is a switch" "$T/bad.out"'
check "not key = value: named" '[ "$(conf "just words\\n")" = 2 ] && grep -q "bad.conf:1: expected .key = value." "$T/bad.out"'
check "unknown role: named" '[ "$(conf "role = wizard\\n")" = 2 ] && grep -q "unknown role .wizard." "$T/bad.out"'
check "a role on the command line that contradicts the file" '"$B/kvd" relay --config "$T/etc/kvd/kvd.conf" > "$T/bad.out" 2>&1; [ $? -eq 2 ] && grep -q "is not the config" "$T/bad.out"'
mkdir -p "$T/k1" "$T/k2"
printf 'state-dir = %s\nprint-key = true\n' "$T/k1" > "$T/key.conf"
k1=$("$B/kvd" --config "$T/key.conf" 2>/dev/null)
k2=$("$B/kvd" --config "$T/key.conf" --state-dir "$T/k2" 2>/dev/null)
k2b=$("$B/kvd" stage --state-dir "$T/k2" --print-key 2>/dev/null)
check "options from the file apply; the command line wins" '[ ${#k1} -eq 64 ] && [ "$k2" = "$k2b" ] && [ "$k1" != "$k2" ]'
printf 'role = relay\nlisten = 127.0.0.1:0\nplain = true\nmax-bridges = 99999999999\n' > "$T/relay.conf"
"$B/kvd" --config "$T/relay.conf" > "$T/relay.out" 2>&1
check "a relay config's values are checked by the relay" '[ $? -eq 2 ] && grep -q -- "--max-bridges" "$T/relay.out"'
finish
