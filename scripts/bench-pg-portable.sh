#!/usr/bin/env bash
# Portable fingerprint on PostgreSQL against the hand-written sum of md5: median of N alternating rounds.
# usage: scripts/bench-pg-portable.sh [ROUNDS=5]   (DB= the database URL)
# Set-up: psql "$DB" -v rows=30000 -f scripts/bench-pg-portable-setup.sql
# fixpoint's statement: FIXPOINT_SQL= a file holding the SELECT that `fixpoint fingerprint s.t
# --portable --db "$DB"` sends (log_min_duration_statement = 0 shows it in the server's log).
set -euo pipefail
ROUNDS=${1:-5}; DB=${DB:-postgres://root@127.0.0.1:5432/pfp_bench}
SESSION="SET DateStyle = 'ISO, YMD'; SET TimeZone = 'UTC'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1;"
time_one() {  # one query in a fresh session, after a warm-up run of the same query; prints ms
  { echo "$SESSION"; cat "$1"; echo '\timing on'; cat "$1"; } \
    | psql "$DB" -qAt -v ON_ERROR_STOP=1 | grep -oP '^Time: \K[0-9.]+'
}
declare -A T
here=$(dirname "$0")
declare -A FILE=([hand]="$here/bench-pg-portable-hand.sql" [fixpoint]="${FIXPOINT_SQL:?FIXPOINT_SQL: the file with the statement fixpoint sends}")
for r in $(seq "$ROUNDS"); do
  for side in hand fixpoint; do T[$side]+="$(time_one "${FILE[$side]}") "; done
done
med() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
h=$(echo ${T[hand]} | med); f=$(echo ${T[fixpoint]} | med)
echo "rows: $(psql "$DB" -qAtc "SELECT count(*) FROM s.t")"
echo "hand-written ms: ${T[hand]}-> median $h"
echo "fixpoint     ms: ${T[fixpoint]}-> median $f"
awk -v h="$h" -v f="$f" 'BEGIN { printf "ratio fixpoint/hand: %.2fx\n", f / h }'
