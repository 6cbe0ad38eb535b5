#!/usr/bin/env bash
# Load test of `infgram serve`, run by hand (not in CI): starts the server on 127.0.0.1 with
# the Tiny Shakespeare index, drives it with wrk (a real HTTP load generator; Debian: `apt-get
# install wrk`), every run bounded in request count and in time and stopping by itself, and
# prints a table:
#   baseline  GET /health: the HTTP floor of this server on this machine
#   (a)       count queries over keep-alive connections
#   (b)       every query type with 10% malformed requests, 3 rounds (RSS after each)
#   (c)       count queries while a neural generation streams (MODEL=none skips the model)
#
# Usage: scripts/loadtest.sh [REQUESTS]   (default 100000; env CONNECTIONS=32, MODEL=smollm2-135m)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
CONNECTIONS=${CONNECTIONS:-32}
MODEL=${MODEL:-smollm2-135m}
CAP=${CAP:-20s} # the time bound of each run (wrk waits it out even when LIMIT came first)
command -v wrk > /dev/null || { echo "needs wrk (Debian: apt-get install wrk)" >&2; exit 1; }
cargo build --release --quiet
BIN=target/release/infgram
TMP=$(mktemp -d)
SERVER=""
STREAM=""
cleanup() {
  [ -n "$STREAM" ] && kill "$STREAM" 2> /dev/null || true
  [ -n "$SERVER" ] && kill "$SERVER" 2> /dev/null && wait "$SERVER" 2> /dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

cp "$($BIN fetch tiny-shakespeare)" "$TMP/ts.txt"
$BIN index -o "$TMP/ts" "$TMP/ts.txt" > /dev/null
ARGS=(--index "ts=$TMP/ts")
if [ "$MODEL" != none ]; then
  $BIN index --tokenizer "$MODEL" -o "$TMP/ts-model" "$TMP/ts.txt" > /dev/null
  ARGS+=(--index "tsm=$TMP/ts-model" --model "$MODEL" --threads 1)
fi
$BIN serve --addr 127.0.0.1:0 --quiet "${ARGS[@]}" 2> "$TMP/server.log" &
SERVER=$!
for _ in $(seq 600); do
  grep -q "listening on" "$TMP/server.log" 2> /dev/null && break
  sleep 0.1
done
URL=$(grep -o "http://127.0.0.1:[0-9]*" "$TMP/server.log" | head -1)
[ -n "$URL" ] || { cat "$TMP/server.log" >&2; exit 1; }
rss() { ps -o rss= -p "$SERVER" | awk '{printf "%.1f", $1 / 1024}'; }

# One bounded wrk run: prints its RESULT line's fields.
load() { # LIMIT MODE
  wrk -t1 -c"$CONNECTIONS" -d"$CAP" --latency -s scripts/loadtest.lua "$URL/" -- "$1" "$2" ts \
    | grep "^RESULT" | sed 's/^RESULT //'
}
field() { echo "$1" | tr ' ' '\n' | grep "^$2=" | cut -d= -f2; }
row() { # NAME RESULT RSS_BEFORE RSS_AFTER
  printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s → %s |\n" "$1" "$(field "$2" responses)" \
    "$(field "$2" rps)" "$(field "$2" p50_ms)" "$(field "$2" p99_ms)" "$(field "$2" ok)" \
    "$(field "$2" 4xx)" "$(( $(field "$2" 5xx) + $(field "$2" wrong) + $(field "$2" socket_errors) ))" "$3" "$4"
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); wrk -t1 -c$CONNECTIONS, each run ≤ $N requests and ≤ $CAP"
echo
echo "| run | requests | req/s | p50 ms | p99 ms | 200 | 4xx | 5xx + wrong + socket errors | RSS MB before → after |"
echo "|---|---|---|---|---|---|---|---|---|"
R0=$(rss)
H=$(wrk -t1 -c"$CONNECTIONS" -d5s --latency "$URL/health" | awk '/Requests\/sec/ {print $2}')
printf "| baseline: GET /health, 5 s | - | %.0f | - | - | - | - | - | %s |\n" "$H" "$R0"
B=$(rss); A=$(load "$N" count); row "(a) count" "$A" "$B" "$(rss)"
for round in 1 2 3; do
  B=$(rss); M=$(load "$N" mixed); row "(b) mixed, 10% malformed, round $round" "$M" "$B" "$(rss)"
done
if [ "$MODEL" != none ]; then
  QUIET_N=$(( N / 5 ))
  B=$(rss); IDLE=$(load "$QUIET_N" count); row "(c) count, idle" "$IDLE" "$B" "$(rss)"
  curl -sN -X POST "$URL/v1/completions" \
    -d '{"prompt": "ROMEO:", "mode": "neural", "max_tokens": 2048, "stream": true, "temperature": 0.8, "seed": 1}' \
    > "$TMP/stream.txt" &
  STREAM=$!
  sleep 3
  B=$(rss); BUSY=$(load "$QUIET_N" count); row "(c) count, while generating" "$BUSY" "$B" "$(rss)"
  TOKENS=$(grep -c '^data: {' "$TMP/stream.txt" || true)
  kill "$STREAM" 2> /dev/null || true; STREAM=""
  echo
  echo "(c) the stream had sent $TOKENS events when the count run ended; p99 while generating / idle: $(awk -v a="$(field "$BUSY" p99_ms)" -v b="$(field "$IDLE" p99_ms)" 'BEGIN {printf "%.2f", a / b}')×"
fi
echo
echo "(a) count req/s / GET /health req/s: $(awk -v a="$(field "$A" rps)" -v b="$H" 'BEGIN {printf "%.2f", a / b}')"
