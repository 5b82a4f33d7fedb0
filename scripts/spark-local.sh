#!/usr/bin/env bash
# Local Spark test cluster for fixpoint's Spark engine (Spark Connect).
#
#   scripts/spark-local.sh start    # install pyspark if needed, start master + worker + Connect server
#   scripts/spark-local.sh stop     # stop all of them (safe when nothing runs)
#   scripts/spark-local.sh status   # exit 0 iff the Connect port answers; prints the URL on stdout
#
# Everything lives under ${FIXPOINT_SPARK_HOME:-$HOME/.cache/fixpoint/spark}:
#   venv/               python3 venv with pyspark[connect]==$SPARK_VERSION (the wheel ships the jars)
#   work/conf/          generated spark-defaults.conf
#   work/logs/          daemon logs (spark-fixpoint-<class>-1-<host>.out)
#   work/pids/          daemon pid files
#   work/metastore/     Hive metastore on embedded Derby (derby.system.home)
#   work/warehouse/     spark.sql.warehouse.dir
#   work/worker/        worker scratch (executor stdout/stderr, app dirs)
#   work/tmp/           SPARK_LOCAL_DIRS (shuffle/block files) and java.io.tmpdir
#
# Every process binds to 127.0.0.1 only. Only stderr is used, except `status`,
# which prints sc://127.0.0.1:<port> on stdout when the server answers.
#
# Environment knobs (all optional):
#   FIXPOINT_SPARK_HOME            base directory (see above)
#   FIXPOINT_SPARK_VENV            virtualenv path (default $FIXPOINT_SPARK_HOME/venv)
#   FIXPOINT_SPARK_CONNECT_PORT    Spark Connect port (default 15002)
#   FIXPOINT_SPARK_MASTER_PORT     standalone master port (default 7077)
#   FIXPOINT_SPARK_MASTER_UI_PORT  master web UI (default 8080)
#   FIXPOINT_SPARK_WORKER_UI_PORT  worker web UI (default 8081)
#   FIXPOINT_SPARK_START_TIMEOUT   seconds to wait for the Connect port (default 240)
#   FIXPOINT_PYTHON                interpreter used to create the venv (default python3)
set -euo pipefail

SPARK_VERSION=4.3.0
HOST=127.0.0.1

SPARK_BASE="${FIXPOINT_SPARK_HOME:-$HOME/.cache/fixpoint/spark}"
VENV="${FIXPOINT_SPARK_VENV:-$SPARK_BASE/venv}"
WORK="$SPARK_BASE/work"
CONNECT_PORT="${FIXPOINT_SPARK_CONNECT_PORT:-15002}"
MASTER_PORT="${FIXPOINT_SPARK_MASTER_PORT:-7077}"
MASTER_UI_PORT="${FIXPOINT_SPARK_MASTER_UI_PORT:-8080}"
WORKER_UI_PORT="${FIXPOINT_SPARK_WORKER_UI_PORT:-8081}"
START_TIMEOUT="${FIXPOINT_SPARK_START_TIMEOUT:-240}"
PYTHON="${FIXPOINT_PYTHON:-python3}"

MASTER_CLASS=org.apache.spark.deploy.master.Master
WORKER_CLASS=org.apache.spark.deploy.worker.Worker
CONNECT_CLASS=org.apache.spark.sql.connect.service.SparkConnectServer
IDENT=fixpoint

log() { printf 'spark-local: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
  echo "usage: $0 {start|stop|status}" >&2
  exit 2
}

# --- helpers ---------------------------------------------------------------

port_open() { # port -> 0 if something accepts TCP on 127.0.0.1:port
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

pid_file() { echo "$WORK/pids/spark-$IDENT-$1-1.pid"; }

# pid of a daemon we started, if it is still a live java process.
live_pid() {
  local f pid
  f="$(pid_file "$1")"
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f" 2>/dev/null || true)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ "$(ps -p "$pid" -o comm= 2>/dev/null || true)" == java* ]] || return 1
  echo "$pid"
}

log_file() { echo "$WORK/logs/spark-$IDENT-$1-1-${HOSTNAME:-$(hostname)}.out"; }

tail_logs() {
  local c f
  for c in "$MASTER_CLASS" "$WORKER_CLASS" "$CONNECT_CLASS"; do
    f="$(log_file "$c")"
    if [[ -f "$f" ]]; then
      printf '\n==> %s (last 40 lines) <==\n' "$f" >&2
      tail -n 40 "$f" >&2 || true
    fi
  done
}

setup_java() {
  if [[ -z "${JAVA_HOME:-}" ]]; then
    local j
    j="$(command -v java || true)"
    [[ -n "$j" ]] || die "java not found; Spark $SPARK_VERSION needs Java 17 or newer"
    JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$j")")")"
    export JAVA_HOME
  fi
  [[ -x "$JAVA_HOME/bin/java" ]] || die "JAVA_HOME=$JAVA_HOME has no bin/java"
  local v major
  v="$("$JAVA_HOME/bin/java" -version 2>&1 | head -n 1)"
  major="$(sed -E 's/.*version "([0-9]+).*/\1/' <<<"$v")"
  if [[ ! "$major" =~ ^[0-9]+$ ]] || ((major < 17)); then
    die "Spark $SPARK_VERSION needs Java 17+, found: $v (JAVA_HOME=$JAVA_HOME)"
  fi
}

ensure_venv() {
  local have=""
  if [[ -x "$VENV/bin/python" ]]; then
    have="$("$VENV/bin/python" -c \
      'import pyspark, grpc, grpc_status, pyarrow, pandas, google.protobuf; print(pyspark.__version__)' \
      2>/dev/null || true)"
  fi
  if [[ "$have" == "$SPARK_VERSION" ]]; then
    return 0
  fi
  log "installing pyspark[connect]==$SPARK_VERSION into $VENV (about 500 MB, one-off)"
  if [[ ! -x "$VENV/bin/python" ]]; then
    mkdir -p "$(dirname "$VENV")"
    "$PYTHON" -m venv "$VENV" >&2
  fi
  "$VENV/bin/python" -m pip install --disable-pip-version-check -q \
    "pyspark[connect]==$SPARK_VERSION" >&2
  have="$("$VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')"
  [[ "$have" == "$SPARK_VERSION" ]] || die "venv has pyspark $have, wanted $SPARK_VERSION"
}

spark_env() {
  SPARK_HOME="$("$VENV/bin/python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')"
  [[ -x "$SPARK_HOME/sbin/spark-daemon.sh" ]] || die "no sbin/spark-daemon.sh in $SPARK_HOME"
  ls "$SPARK_HOME"/jars/spark-connect_*.jar >/dev/null 2>&1 ||
    die "no spark-connect jar in $SPARK_HOME/jars"

  mkdir -p "$WORK"/{conf,logs,pids,metastore,warehouse,worker,tmp}

  export SPARK_HOME
  export SPARK_CONF_DIR="$WORK/conf"
  export SPARK_LOG_DIR="$WORK/logs"
  export SPARK_PID_DIR="$WORK/pids"
  export SPARK_IDENT_STRING="$IDENT"
  export SPARK_LOCAL_IP="$HOST"
  export SPARK_LOCAL_HOSTNAME="$HOST"
  export SPARK_MASTER_HOST="$HOST"
  export SPARK_MASTER_PORT="$MASTER_PORT"
  export SPARK_MASTER_WEBUI_PORT="$MASTER_UI_PORT"
  export SPARK_WORKER_WEBUI_PORT="$WORKER_UI_PORT"
  export SPARK_WORKER_CORES=2
  export SPARK_WORKER_MEMORY=2g
  export SPARK_WORKER_DIR="$WORK/worker"
  export SPARK_LOCAL_DIRS="$WORK/tmp"
  export SPARK_DAEMON_MEMORY=512m # heap of master and worker daemons
  export SPARK_DAEMON_JAVA_OPTS="-Djava.io.tmpdir=$WORK/tmp"
  export PYSPARK_PYTHON="$VENV/bin/python"
  # The venv's pyspark must not be shadowed by a stray SPARK_REMOTE / connect mode.
  unset SPARK_REMOTE SPARK_CONNECT_MODE_ENABLED || true

  # spark-defaults.conf is read by spark-submit (Connect driver) and by the
  # master/worker daemons. Values are literal (no shell expansion by Spark).
  local derby="$WORK/metastore"
  cat >"$SPARK_CONF_DIR/spark-defaults.conf" <<EOF
# generated by scripts/spark-local.sh -- do not edit, rewritten on every start
spark.master                                 spark://$HOST:$MASTER_PORT
spark.driver.host                            $HOST
spark.driver.bindAddress                     $HOST
spark.driver.memory                          1g
spark.executor.memory                        1g
spark.executor.cores                         2
spark.cores.max                              2
spark.log.structuredLogging.enabled          false
spark.master.rest.enabled                    false
spark.ui.showConsoleProgress                 false
spark.sql.shuffle.partitions                 4
spark.sql.catalogImplementation              hive
spark.sql.warehouse.dir                      $WORK/warehouse
spark.hadoop.javax.jdo.option.ConnectionURL  jdbc:derby:;databaseName=$derby/metastore_db;create=true
spark.driver.extraJavaOptions                -Dderby.system.home=$derby -Djava.io.tmpdir=$WORK/tmp
spark.executor.extraJavaOptions              -Djava.io.tmpdir=$WORK/tmp
spark.jars.ivy                               $WORK/ivy
spark.connect.grpc.binding.address           $HOST
spark.connect.grpc.binding.port              $CONNECT_PORT
spark.pyspark.python                         $VENV/bin/python
EOF
}

daemon() { # daemon.sh args..., stdout folded into stderr
  # Run from $WORK so anything Spark/Derby writes relative to the cwd
  # (derby.log, metastore_db, spark-warehouse) stays in the scratch dir.
  (cd "$WORK" && "$SPARK_HOME/sbin/spark-daemon.sh" "$@") >&2
}

wait_port() { # port timeout
  local port="$1" timeout="$2" start=$SECONDS
  while ! port_open "$port"; do
    if ((SECONDS - start >= timeout)); then
      return 1
    fi
    sleep 1
  done
}

stop_one() { # class
  local cls="$1" pid i
  if pid="$(live_pid "$cls")"; then
    log "stopping ${cls##*.} (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "${cls##*.} (pid $pid) still alive after 30s, sending SIGKILL"
      kill -9 "$pid" 2>/dev/null || true
      sleep 1
    fi
  fi
  rm -f "$(pid_file "$cls")"
}

# --- subcommands -----------------------------------------------------------

cmd_status() {
  if port_open "$CONNECT_PORT"; then
    local c p
    for c in "$MASTER_CLASS" "$WORKER_CLASS" "$CONNECT_CLASS"; do
      if p="$(live_pid "$c")"; then
        log "${c##*.}: running (pid $p)"
      else
        log "${c##*.}: not running (or not started by this script)"
      fi
    done
    echo "sc://$HOST:$CONNECT_PORT"
    return 0
  fi
  log "Spark Connect is not answering on $HOST:$CONNECT_PORT"
  return 1
}

cmd_start() {
  if port_open "$CONNECT_PORT"; then
    log "already running: sc://$HOST:$CONNECT_PORT"
    return 0
  fi
  setup_java
  ensure_venv
  spark_env
  local t0=$SECONDS

  if live_pid "$MASTER_CLASS" >/dev/null; then
    log "master already running"
  else
    log "starting master on spark://$HOST:$MASTER_PORT"
    daemon start "$MASTER_CLASS" 1 \
      --host "$HOST" --port "$MASTER_PORT" --webui-port "$MASTER_UI_PORT"
  fi
  if ! wait_port "$MASTER_PORT" 60; then
    tail_logs
    die "master did not open $HOST:$MASTER_PORT within 60s"
  fi

  # Worker and Connect server are launched side by side: spark-daemon.sh
  # itself sleeps ~2.5 s after each launch to see whether the JVM survived.
  local jobs=()
  if live_pid "$WORKER_CLASS" >/dev/null; then
    log "worker already running"
  else
    log "starting worker (2 cores, 2g)"
    daemon start "$WORKER_CLASS" 1 \
      --host "$HOST" --webui-port "$WORKER_UI_PORT" \
      --cores 2 --memory 2g --work-dir "$WORK/worker" \
      "spark://$HOST:$MASTER_PORT" &
    jobs+=($!)
  fi

  if live_pid "$CONNECT_CLASS" >/dev/null; then
    log "Connect server already starting"
  else
    log "starting Spark Connect server on $HOST:$CONNECT_PORT"
    daemon submit "$CONNECT_CLASS" 1 \
      --name "fixpoint Spark Connect server" \
      --master "spark://$HOST:$MASTER_PORT" \
      --driver-memory 1g &
    jobs+=($!)
  fi
  local j
  for j in "${jobs[@]}"; do
    wait "$j" || die "spark-daemon.sh failed (see $WORK/logs)"
  done

  local start=$SECONDS last=-1 elapsed
  while ! port_open "$CONNECT_PORT"; do
    elapsed=$((SECONDS - start))
    if ! live_pid "$CONNECT_CLASS" >/dev/null; then
      tail_logs
      die "Spark Connect server exited during startup (logs above, in $WORK/logs)"
    fi
    if ((elapsed >= START_TIMEOUT)); then
      tail_logs
      die "Spark Connect did not answer on $HOST:$CONNECT_PORT within ${START_TIMEOUT}s (logs above); run '$0 stop' to clean up"
    fi
    if ((elapsed / 10 != last)); then
      last=$((elapsed / 10))
      log "waiting for Spark Connect on $HOST:$CONNECT_PORT (${elapsed}s)"
    fi
    sleep 1
  done

  # The app gets its executor once the worker has registered; wait briefly so
  # the first query does not sit in "Initial job has not accepted any resources".
  local wlog i
  wlog="$(log_file "$WORKER_CLASS")"
  for ((i = 0; i < 30; i++)); do
    grep -q "Successfully registered with master" "$wlog" 2>/dev/null && break
    sleep 1
  done
  grep -q "Successfully registered with master" "$wlog" 2>/dev/null ||
    log "warning: worker has not registered with the master yet (see $wlog)"

  log "ready after $((SECONDS - t0))s: sc://$HOST:$CONNECT_PORT (logs in $WORK/logs)"
}

cmd_stop() {
  local any=0 c
  for c in "$CONNECT_CLASS" "$WORKER_CLASS" "$MASTER_CLASS"; do
    if live_pid "$c" >/dev/null; then any=1; fi
    stop_one "$c"
  done
  if ((any)); then
    log "stopped"
  else
    log "nothing running"
  fi
  if port_open "$CONNECT_PORT"; then
    log "warning: $HOST:$CONNECT_PORT still answers (a process not started by this script?)"
  fi
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
