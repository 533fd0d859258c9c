#!/usr/bin/env bash
# Start a local Prefect server (SQLite, 127.0.0.1), create the `layerwave` process work pool,
# deploy deploy/prefect.yaml and start a worker. deploy/server-down.sh stops what this started.
#
# Settings (environment): LAYERWAVE_PREFECT_PORT (4200), LAYERWAVE_RUN_DIR (.prefect-run: PID
# files and logs), PREFECT_HOME (.prefect-run/home: the SQLite database).
set -euo pipefail
cd "$(dirname "$0")/.."
run_dir="${LAYERWAVE_RUN_DIR:-$PWD/.prefect-run}"
port="${LAYERWAVE_PREFECT_PORT:-4200}"
mkdir -p "$run_dir"
export PREFECT_HOME="${PREFECT_HOME:-$run_dir/home}"
export PREFECT_API_URL="http://127.0.0.1:$port/api"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 LAYERWAVE_REPO="$PWD"

# Each process gets its own session (setsid), so server-down.sh can stop it with its children.
setsid .venv/bin/prefect server start --host 127.0.0.1 --port "$port" >"$run_dir/server.log" 2>&1 &
echo $! >"$run_dir/server.pid"
.venv/bin/python - "$PREFECT_API_URL/health" <<'PY'
import sys, time, urllib.request
deadline = time.time() + 180
while time.time() < deadline:
    try:
        urllib.request.urlopen(sys.argv[1], timeout=2)
        sys.exit(0)
    except OSError:
        time.sleep(1)
sys.exit("the Prefect server did not answer within 180 s; see server.log")
PY
.venv/bin/prefect --no-prompt work-pool create layerwave --type process --overwrite >/dev/null
.venv/bin/prefect --no-prompt deploy --all --prefect-file deploy/prefect.yaml >"$run_dir/deploy.log" 2>&1 \
    || { cat "$run_dir/deploy.log"; exit 1; }
setsid .venv/bin/prefect worker start --pool layerwave --type process >"$run_dir/worker.log" 2>&1 &
echo $! >"$run_dir/worker.pid"
echo "Prefect server at http://127.0.0.1:$port with deployments layerwave-pipeline, layerwave-study-cluster and layerwave-sweep."
echo "Use it from this shell with: export PREFECT_API_URL=$PREFECT_API_URL"
