#!/bin/bash
# test-market-pg.sh — the market on PostgreSQL: a throwaway server from Debian's packages
# (initdb + pg_ctl in the scratch directory, as the postgres user when run as root), then
# the store's cases (tests/unit/test-market-store.c) and the API test (tests/integration/test-market-api.sh:
# claims, signatures, receipts, kill -9 durability) with the market on that server.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$TOOLS/test-market-store"
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] ||
    die "PostgreSQL server binaries missing (/usr/lib/postgresql/*/bin; scripts/setup.sh installs postgresql)"
RUNAS=()
chmod 755 "$T"
mkdir -p "$T/pg"
if [ "$(id -u)" = 0 ]; then
    chown postgres "$T/pg"
    RUNAS=(runuser -u postgres --)
fi
"${RUNAS[@]}" "$PGBIN/initdb" -D "$T/pg/data" -A trust -U kv >"$T/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -5 "$T/initdb.log")"
# The server listens on a Unix socket in the scratch directory only (no TCP port to pick and
# race for): the port number just names the socket file, $T/pg/.s.PGSQL.5432.
PGPORT=5432
"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$T/pg/data" -l "$T/pg/server.log" -w -t 60 \
    -o "-p $PGPORT -k $T/pg -c listen_addresses= -c fsync=off" start >"$T/pg_ctl.log" 2>&1 ||
    die "pg_ctl start failed: $(tail -5 "$T/pg_ctl.log"; tail -5 "$T/pg/server.log" 2>/dev/null)"
at_exit '"${RUNAS[@]}" "$PGBIN/pg_ctl" -D "$T/pg/data" -m immediate stop >/dev/null 2>&1'
for db in store api; do
    "$PGBIN/createdb" -h "$T/pg" -p "$PGPORT" -U kv "market_$db" || die "createdb market_$db failed"
done
KV_MARKET_PG="postgres://kv@/market_store?host=$T/pg&port=$PGPORT" "$TOOLS/test-market-store" 2>&1 |
    tee "$T/store.out" | tail -n 8
grep -q " 0 failed;" "$T/store.out" || fail "the store's cases failed on PostgreSQL"
KV_MARKET_DB="postgres://kv@/market_api?host=$T/pg&port=$PGPORT" bash tests/integration/test-market-api.sh >"$T/api.out" 2>&1 ||
    { grep -v "^ok" "$T/api.out" | head -30; fail "test-market-api.sh failed on PostgreSQL"; }
grep -c "^ok" "$T/api.out" | sed 's/^/ok   test-market-api.sh on PostgreSQL: /; s/$/ checks passed/'
finish
