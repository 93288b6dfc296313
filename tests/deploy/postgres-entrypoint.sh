#!/bin/sh
# The official image's first start, reduced to what deploy/compose.yaml relies on: make the cluster with
# POSTGRES_USER as its superuser (password auth over TCP) and POSTGRES_DB, then run the command as postgres.
set -eu
if [ "${1:-}" != postgres ]; then
  exec "$@"
fi
user="${POSTGRES_USER:-postgres}"
mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp) && printf '%s' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}" > "$pwfile"
  chown postgres "$pwfile"
  runuser -u postgres -- initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  db="${POSTGRES_DB:-$user}"
  if [ "$db" != postgres ]; then
    runuser -u postgres -- pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    runuser -u postgres -- createdb -U "$user" "$db"
    runuser -u postgres -- pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec runuser -u postgres -- "$@"
