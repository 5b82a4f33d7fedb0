#!/bin/sh
# A local S3-compatible server (moto, from PyPI) for the tests of Delta
# warehouses on object storage: scripts/moto-local.sh start | stop | status.
# It listens on 127.0.0.1:${FIXPOINT_MOTO_PORT:-5055}, keeps everything in
# memory, and has the bucket the tests use (fixpoint-test). The tests find
# it through FIXPOINT_TEST_S3 (default http://127.0.0.1:5055).
set -eu
PORT=${FIXPOINT_MOTO_PORT:-5055}
VENV=${FIXPOINT_TEST_VENV:-$HOME/.cache/fixpoint/pyvenv}
PY=$VENV/bin/python
STATE=${TMPDIR:-/tmp}/fixpoint-moto-$PORT
up() {
    "$PY" - "$PORT" <<'PY' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/moto-api/", timeout=2)
PY
}
case "${1:-}" in
start)
    if ! "$PY" -c "import moto.server" 2>/dev/null; then
        "$VENV/bin/pip" install -q "moto[server]"
    fi
    if ! up; then
        nohup "$PY" -m moto.server -H 127.0.0.1 -p "$PORT" >"$STATE.log" 2>&1 &
        echo $! >"$STATE.pid"
        i=0
        until up; do
            i=$((i + 1))
            if [ $i -gt 60 ]; then
                echo "moto-local: the server did not start; see $STATE.log" >&2
                exit 1
            fi
            sleep 0.5
        done
    fi
    "$PY" - "$PORT" <<'PY'
import sys, boto3
s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1")
if "fixpoint-test" not in [b["Name"] for b in s3.list_buckets().get("Buckets", [])]:
    s3.create_bucket(Bucket="fixpoint-test")
PY
    echo "moto-local: S3 at http://127.0.0.1:$PORT (bucket fixpoint-test)"
    ;;
stop)
    if [ -f "$STATE.pid" ]; then
        kill "$(cat "$STATE.pid")" 2>/dev/null || true
        rm -f "$STATE.pid"
    fi
    ;;
status)
    if up; then echo "moto-local: up on $PORT"; else echo "moto-local: down"; exit 1; fi
    ;;
*)
    echo "usage: scripts/moto-local.sh start|stop|status" >&2
    exit 2
    ;;
esac
