#!/usr/bin/env bash
# Soak test (issue 7): wharf under steady mixed traffic for a bounded time,
# sampling its memory, file descriptors and counters, and failing if they
# grow without bound or calls are left outstanding.
#
#   bench/soak.sh                 # 10 minutes
#   bench/soak.sh --minutes 2     # or SOAK_MINUTES=2 bench/soak.sh
#   bench/soak.sh --out soak.csv  # keep the samples somewhere else
#
# What it does:
#   1. cargo build --release (the wharf binary, in CARGO_TARGET_DIR if set),
#      unless WHARF_BIN names one;
#   2. starts `wharf testbed` and `wharf serve` on free loopback ports, the
#      config (like examples/local.toml, smaller cache) in a temp directory;
#   3. drives traffic with curl loops at a steady rate until the time is up:
#      cache hits, misses on unique URLs (cache churn), slow calls, 404s
#      relayed from the origin, 502s (an origin port nobody listens on), and
#      clients that give up mid-body (`curl --max-time 0.05`);
#   4. every 5 s samples wharf's RSS (/proc/PID/status VmRSS), open fds
#      (/proc/PID/fd) and /metrics (calls outstanding and queued, sessions,
#      cache bytes) into a CSV;
#   5. verdict: FAIL (exit 1) if RSS or fds keep growing (the last third's
#      max above the middle third's max by more than 20 % + 8 MiB, or
#      20 % + 8 fds), if RSS still climbs in the second half of the load
#      (least-squares slope over those samples above SOAK_MAX_SLOPE_KIB per
#      minute, default 512 = 0.5 MiB/min; judged when that half spans at
#      least 60 s, i.e. --minutes 2 or more: the cache fills in under a
#      minute, so the second half is past warm-up), if calls are still
#      outstanding or queued 10 s after the load stops, or if wharf does not
#      exit 0 on SIGTERM.
#
# Only loopback addresses are used; every process started is stopped by PID.
# Needs: bash, curl, awk, python3 (to find free ports), cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes="${SOAK_MINUTES:-10}"
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --minutes=*) minutes="${1#*=}"; shift ;;
        --out) out="$2"; shift 2 ;;
        --out=*) out="${1#*=}"; shift ;;
        -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
        *) echo "soak: unknown argument $1 (try --help)" >&2; exit 2 ;;
    esac
done
case "$minutes" in
    ''|*[!0-9.]*) echo "soak: --minutes wants a number, got '$minutes'" >&2; exit 2 ;;
esac
duration=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
[ "$duration" -ge 30 ] || { echo "soak: at least 0.5 minutes" >&2; exit 2; }
max_slope="${SOAK_MAX_SLOPE_KIB:-512}"
case "$max_slope" in
    ''|*[!0-9]*) echo "soak: SOAK_MAX_SLOPE_KIB wants whole KiB per minute, got '$max_slope'" >&2; exit 2 ;;
esac

for tool in curl awk python3; do
    command -v "$tool" >/dev/null || { echo "soak: $tool is needed" >&2; exit 2; }
done

work="$(mktemp -d "${TMPDIR:-/tmp}/wharf-soak.XXXXXX")"
csv="${out:-$work/samples.csv}"
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# WHARF_BIN=path measures a given binary instead of building one.
if [ -n "${WHARF_BIN:-}" ]; then
    wharf="$WHARF_BIN"
else
    echo "soak: building release binary"
    cargo build --release --quiet --bin wharf
    wharf="${CARGO_TARGET_DIR:-target}/release/wharf"
fi

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
testbed_port=$(free_port)
listen_port=$(free_port)
admin_port=$(free_port)
dead_port=$(free_port) # nothing listens there: 502s
base="http://127.0.0.1:$listen_port"
admin="http://127.0.0.1:$admin_port"
origin="http://127.0.0.1:$testbed_port"

cat > "$work/wharf.toml" <<EOF
# Written by bench/soak.sh: examples/local.toml with free ports and a cache
# small enough for the unique-URL misses to churn it.
[server]
listen = "127.0.0.1:$listen_port"
admin_listen = "127.0.0.1:$admin_port"
shutdown_timeout = "10s"

[services.proxy]
type = "proxy"
path = "/proxy"
allow_private_networks = true
allow_hosts = ["127.0.0.1:$testbed_port", "127.0.0.1:$dead_port"]
cache_max_bytes = "16MiB"
max_object_bytes = "1MiB"
max_ttl = "1h"
connect_timeout = "1s"
first_byte_timeout = "5s"
total_timeout = "10s"
EOF

"$wharf" testbed --listen "127.0.0.1:$testbed_port" > "$work/testbed.log" 2>&1 &
pids+=($!)
"$wharf" --log-format json serve --config "$work/wharf.toml" > "$work/wharf.log" 2>&1 &
wharf_pid=$!
pids+=("$wharf_pid")

up=""
for _ in $(seq 1 100); do
    if curl -sf -o /dev/null "$admin/readyz" && curl -sf -o /dev/null "$origin/fast"; then
        up=yes
        break
    fi
    sleep 0.1
done
[ -n "$up" ] || { echo "soak: wharf or the testbed did not start; logs in $work" >&2; exit 1; }

# The proxy URL for an origin path (percent-encoded), with cacheDuration.
# Pure bash (no process per call): letters, digits and -._~ stay, the rest is %XX.
enc() {
    local s="$1" out="" c hex i
    for (( i = 0; i < ${#s}; i++ )); do
        c="${s:i:1}"
        case "$c" in
            [a-zA-Z0-9.~_-]) out+="$c" ;;
            *) printf -v hex '%%%02X' "'$c"; out+="$hex" ;;
        esac
    done
    printf '%s' "$out"
}
proxy() { echo "$base/proxy?url=$(enc "$1")&cacheDuration=$2"; }

end=$(( $(date +%s) + duration ))
# One loop of calls at a steady pace; status codes are tallied in $work/$name.codes.
load_loop() {
    local name="$1" pause="$2" kind="$3" i=0 url
    while [ "$(date +%s)" -lt "$end" ]; do
        i=$((i + 1))
        case "$kind" in
            hit) url=$(proxy "$origin/bytes/8192" 60) ;;
            miss) url=$(proxy "$origin/bytes/$(( 1024 + (i % 64) * 1024 ))?u=$name-$i" 60) ;;
            slow) url=$(proxy "$origin/slow?ms=300" 0) ;;
            notfound) url=$(proxy "$origin/status/404" 60) ;;
            badgateway) url=$(proxy "http://127.0.0.1:$dead_port/x" 60) ;;
            abort) url=$(proxy "$origin/stream?first_byte_ms=10&total_ms=800&bytes=200000&u=$name-$((i % 3))" $((i % 2 * 60))) ;;
        esac
        local limit=15 code
        [ "$kind" = abort ] && limit=0.05
        # A call cut by the client's own --max-time is tallied as CODE-cut.
        if code=$(curl -s -o /dev/null -w '%{http_code}' --max-time "$limit" "$url"); then
            echo "$code" >> "$work/$name.codes"
        else
            echo "$code-cut" >> "$work/$name.codes"
        fi
        sleep "$pause"
    done
}

echo "soak: $minutes min of mixed traffic against $base (samples: $csv)"
load_loop hit-a 0.02 hit & pids+=($!)
load_loop hit-b 0.02 hit & pids+=($!)
load_loop miss 0.02 miss & pids+=($!)
load_loop slow 0.05 slow & pids+=($!)
load_loop slow-b 0.05 slow & pids+=($!)
load_loop notfound 0.1 notfound & pids+=($!)
load_loop badgateway 0.1 badgateway & pids+=($!)
load_loop abort 0.05 abort & pids+=($!)
load_pids=("${pids[@]:2}")

metric() { # metric PAGE SERIES -> value or 0
    awk -v s="$2" 'index($0, s " ") == 1 { print $2; found = 1; exit } END { if (!found) print 0 }' <<< "$1"
}
is_zero() { awk -v v="$1" 'BEGIN { exit !(v + 0 == 0) }'; }
sample() {
    local page rss fds
    page=$(curl -s --max-time 2 "$admin/metrics" || true)
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$wharf_pid/status")
    fds=$(ls "/proc/$wharf_pid/fd" | wc -l)
    echo "$(date +%s),$(( $(date +%s) - start )),$rss,$fds,$(metric "$page" 'wharf_calls_outstanding{service="proxy"}'),$(metric "$page" 'wharf_calls_queued{service="proxy"}'),$(metric "$page" 'wharf_sessions_active'),$(metric "$page" 'wharf_cache_bytes{service="proxy"}'),$(metric "$page" 'wharf_cache_evictions_total{service="proxy"}')"
}
start=$(date +%s)
echo "unix_time,elapsed_s,rss_kib,fds,calls_outstanding,calls_queued,sessions_active,cache_bytes,cache_evictions" > "$csv"
while [ "$(date +%s)" -lt "$end" ]; do
    sample >> "$csv"
    sleep 5
done
for pid in "${load_pids[@]}"; do wait "$pid" 2>/dev/null || true; done

# After the load: every call done, nothing queued.
drained=""
for _ in $(seq 1 100); do
    page=$(curl -s --max-time 2 "$admin/metrics" || true)
    if is_zero "$(metric "$page" 'wharf_calls_outstanding{service="proxy"}')" &&
        is_zero "$(metric "$page" 'wharf_calls_queued{service="proxy"}')"; then
        drained=yes
        break
    fi
    sleep 0.1
done
sample >> "$csv"

echo
echo "soak: calls by loop and status"
for f in "$work"/*.codes; do
    printf '  %-11s %s\n' "$(basename "$f" .codes)" "$(sort "$f" | uniq -c | awk '{ printf "%s×%s ", $1, $2 }')"
done

verdict=0
summary=$(awk -F, -v d="$duration" 'NR > 1 { n++; t[n] = $2; rss[n] = $3; fds[n] = $4 }
END {
    a = int(n / 3); b = int(2 * n / 3)
    for (i = 1; i <= n; i++) {
        if (i <= a) { r1 = (rss[i] > r1 ? rss[i] : r1); f1 = (fds[i] > f1 ? fds[i] : f1) }
        else if (i <= b) { r2 = (rss[i] > r2 ? rss[i] : r2); f2 = (fds[i] > f2 ? fds[i] : f2) }
        else { r3 = (rss[i] > r3 ? rss[i] : r3); f3 = (fds[i] > f3 ? fds[i] : f3) }
    }
    # RSS slope over the second half of the load (least squares, KiB per
    # minute); the last row, sampled after the load stopped, is left out.
    for (i = 1; i < n; i++) {
        if (t[i] < d / 2 || t[i] > d) continue
        k++; sx += t[i]; sy += rss[i]; sxx += t[i] * t[i]; sxy += t[i] * rss[i]
        if (k == 1) first = t[i]; last = t[i]
    }
    den = k * sxx - sx * sx
    slope = (k >= 3 && den > 0) ? (k * sxy - sx * sy) / den * 60 : 0
    span = k >= 1 ? last - first : 0
    printf "%d %d %d %d %d %d %d %.0f %d %d\n", n, r1, r2, r3, f1, f2, f3, slope, k, span
}' "$csv")
read -r n r1 r2 r3 f1 f2 f3 slope slope_n slope_span <<< "$summary"
echo
echo "soak: $n samples; max RSS by third: $r1 / $r2 / $r3 KiB; max fds by third: $f1 / $f2 / $f3"
echo "soak: RSS slope over the second half of the load: $slope KiB/min ($slope_n samples over $slope_span s; bound $max_slope KiB/min)"
if [ "$n" -lt 6 ]; then
    echo "soak: FAIL: too few samples ($n)"; verdict=1
fi
if [ "$slope_span" -lt 60 ]; then
    echo "soak: RSS slope not judged (the second half spans under 60 s; use --minutes 2 or more)"
elif [ "$slope" -gt "$max_slope" ]; then
    echo "soak: FAIL: RSS still climbing ($slope KiB/min over the second half > $max_slope)"; verdict=1
fi
if [ "$r3" -gt $(( r2 * 12 / 10 + 8192 )) ]; then
    echo "soak: FAIL: RSS still growing (last third max $r3 KiB > 1.2 × $r2 + 8 MiB)"; verdict=1
fi
if [ "$f3" -gt $(( f2 * 12 / 10 + 8 )) ]; then
    echo "soak: FAIL: open fds still growing (last third max $f3 > 1.2 × $f2 + 8)"; verdict=1
fi
if [ -z "$drained" ]; then
    echo "soak: FAIL: calls still outstanding or queued 10 s after the load stopped"; verdict=1
fi

# Graceful stop: SIGTERM must drain and exit 0.
kill -TERM "$wharf_pid"
status=0
wait "$wharf_pid" || status=$?
if [ "$status" -ne 0 ]; then
    echo "soak: FAIL: wharf exited $status on SIGTERM"; verdict=1
fi
if grep -q panicked "$work/wharf.log"; then
    echo "soak: FAIL: wharf logged a panic ($work/wharf.log)"; verdict=1
fi

echo "soak: samples in $csv, logs in $work"
if [ "$verdict" -eq 0 ]; then echo "soak: PASS"; else echo "soak: FAIL"; fi
exit "$verdict"
