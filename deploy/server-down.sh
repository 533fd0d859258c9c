#!/usr/bin/env bash
# Stop the worker and the Prefect server that deploy/server-up.sh started, by their PIDs
# (`server-down.sh worker` stops only the worker). Workers ignore the first SIGTERM, so the
# worker gets TERM, then INT.
set -uo pipefail
cd "$(dirname "$0")/.."
run_dir="${LAYERWAVE_RUN_DIR:-$PWD/.prefect-run}"

stop() {  # stop <name> <signal>...: signal the process group, give it 10 s per signal
    local file="$run_dir/$1.pid"; shift
    [ -f "$file" ] || return 0
    local pid; pid="$(cat "$file")"
    for signal in "$@"; do
        kill -0 "$pid" 2>/dev/null || break
        kill "-$signal" -- "-$pid" 2>/dev/null || kill "-$signal" "$pid" 2>/dev/null
        for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL -- "-$pid" 2>/dev/null
    rm -f "$file"
}
stop worker TERM INT
[ "${1:-all}" = worker ] || stop server TERM INT
echo "stopped ${1:-worker and server}"
