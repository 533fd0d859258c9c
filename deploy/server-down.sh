#!/usr/bin/env bash
# Stop the worker and the Prefect server that deploy/server-up.sh started, by their PIDs
# (`server-down.sh worker` stops only the worker). Workers ignore the first SIGTERM, so the
# worker gets TERM, then INT two seconds later.
set -uo pipefail
cd "$(dirname "$0")/.."
run_dir="${LAYERWAVE_RUN_DIR:-$PWD/.prefect-run}"

stop() {  # stop <name> <seconds> <signal>...: signal the process group, give it <seconds> per signal
    local file="$run_dir/$1.pid" wait=$(( $2 * 2 )); shift 2
    [ -f "$file" ] || return 0
    local pid; pid="$(cat "$file")"
    for signal in "$@"; do
        kill -0 "$pid" 2>/dev/null || break
        kill "-$signal" -- "-$pid" 2>/dev/null || kill "-$signal" "$pid" 2>/dev/null
        for _ in $(seq "$wait"); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$file"
}
stop worker 2 TERM INT
[ "${1:-all}" = worker ] || stop server 10 TERM INT
echo "stopped ${1:-worker and server}"
