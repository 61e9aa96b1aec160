# Helpers for rings whose edges go through a relay (sourced after tests/lib/relay/lib.sh;
# wait_linked is tests/lib/lib.sh's).
# relay_manifest SRC DST RANK ENDPOINT: copy a ring manifest, giving RANK a new endpoint.
relay_manifest() {
    /usr/bin/python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["ranks"][int(sys.argv[3])]["endpoint"] = sys.argv[4]
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
}

# start_stage DIR RANK MODEL [prefix command...]: kvd stage for RANK of DIR/ring.json, its
# pid in DIR/rank-R/kvd.pid (so `kvctl ring down --dir DIR` stops it) and log in kvd.log.
start_stage() {
    local d=$1 r=$2 m=$3; shift 3
    mkdir -p "$d/rank-$r"
    "$@" "$KVD" stage --manifest "$d/ring.json" --rank "$r" --state-dir "$d/rank-$r" -t 1 \
        --model "$m" > "$d/rank-$r/kvd.log" 2>&1 &
    echo $! > "$d/rank-$r/kvd.pid"
    PIDS="$PIDS $!"
}
