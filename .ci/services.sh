#!/usr/bin/env bash
# Services the tests use, on loopback only: a throwaway PostgreSQL cluster and headless Chromium.
# Sourced by .ci/run; exports ABLATE_TEST_POSTGRES_URL. Tests skip with a reason where these are absent.
set -euo pipefail

need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

pg_bin=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -n 1)")
pg_data=$(mktemp -d /tmp/ablate-pg.XXXXXX)
pg_port=${ABLATE_PG_PORT:-$(python3 -c "import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); print(s.getsockname()[1])")}
chown postgres "$pg_data"
run_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
run_pg "$pg_bin/initdb -D $pg_data -U postgres --auth=trust -E UTF8 >/dev/null"
run_pg "$pg_bin/pg_ctl -D $pg_data -o '-c listen_addresses=127.0.0.1 -p $pg_port -k /tmp' -l $pg_data/log -w start >/dev/null"
# Stopped and removed when the shell that sourced this exits, however it exits: on a developer's machine
# each run used to leave a server behind.
trap 'run_pg "$pg_bin/pg_ctl -D $pg_data -m fast -w stop" >/dev/null 2>&1; rm -rf "$pg_data"' EXIT
run_pg "$pg_bin/createdb -h 127.0.0.1 -p $pg_port -U postgres ablate_test"
export ABLATE_TEST_POSTGRES_URL="postgresql+psycopg2://postgres@127.0.0.1:$pg_port/ablate_test"
echo "PostgreSQL on 127.0.0.1:$pg_port ($pg_data)"
