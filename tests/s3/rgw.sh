#!/usr/bin/env bash
# Start and stop a throwaway S3 server for tests: Ceph RADOS Gateway (RGW) on
# 127.0.0.1 (or RGW_ADDR), backed by a one-monitor, one-OSD Ceph cluster that keeps objects
# in memory (memstore). Everything the cluster writes (config, data, logs, pid
# files, admin sockets) lives under DIR, so several instances can coexist and
# nothing lands in /etc/ceph, /var/lib/ceph, /var/log/ceph or /var/run/ceph.
#
#   tests/s3/rgw.sh start  DIR   start; write DIR/env (AWS_* variables) and print it
#   tests/s3/rgw.sh status DIR   say which daemons run; exit 0 only if all do and S3 answers
#   tests/s3/rgw.sh stop   DIR   stop the daemons (by pid) and remove DIR
#
# Needs root and the Debian packages ceph-mon, ceph-osd, ceph-common, radosgw;
# also python3 (free ports), curl (readiness checks) and coreutils' timeout.
# No network access. Works with Ceph 16.2 (Debian 12); see the notes by each
# setting below for why it is there.
#
# Tunables (environment): RGW_TIMEOUT (seconds per wait, default 60),
# RGW_MEMSTORE_BYTES (OSD capacity held in RAM, default 1 GiB), RGW_ADDR (the IPv4
# address S3 listens on, default 127.0.0.1; the monitor and OSD stay on loopback).
# scripts/cluster.sh sets RGW_ADDR to its bridge's address, which network
# namespaces reach and 127.0.0.1 is not.
#
# The caller uses it like:
#   tests/s3/rgw.sh start /tmp/s3 && set -a && . /tmp/s3/env && set +a
#   ... tests ...
#   tests/s3/rgw.sh stop /tmp/s3

set -euo pipefail

readonly TIMEOUT="${RGW_TIMEOUT:-60}"
readonly MEMSTORE_BYTES="${RGW_MEMSTORE_BYTES:-1073741824}"
readonly ADDR="${RGW_ADDR:-127.0.0.1}"
# Fixed test credentials: this server listens on loopback (or a test's own
# bridge) and holds throwaway data, so there is nothing to protect.
readonly ACCESS_KEY="TESTACCESSKEY0000001"
readonly SECRET_KEY="testsecretkey0000000000000000000000000001"
# RGW does not compare the SigV4 credential-scope region with its zonegroup
# name; it signs with whatever region the client puts in the scope. So the
# usual SDK default works, and any other region would work too.
readonly REGION="us-east-1"
readonly MON_ID="a"
readonly RGW_NAME="client.rgw.a"
readonly S3_USER="test"
# Marker line in ceph.conf: "stop" deletes only directories that carry it.
readonly MARKER="# created by tests/s3/rgw.sh"

log() { echo "rgw.sh: $*" >&2; }
die() { echo "rgw.sh: error: $*" >&2; exit 1; }
# die_log LOGFILE MESSAGE: die, showing the end of the log that says why.
die_log() {
  local logf=$1
  shift
  if [[ -s $logf ]]; then
    echo "rgw.sh: --- last lines of $logf ---" >&2
    tail -n 5 "$logf" | cut -c1-300 >&2
  fi
  die "$*"
}
# Microseconds since the epoch, for deadlines ($SECONDS counts whole seconds).
now_us() { echo "${EPOCHREALTIME/./}"; }
# deadline_in SECONDS: the now_us value SECONDS from now.
deadline_in() { echo $(($(now_us) + $1 * 1000000)); }
# Seconds since an $EPOCHREALTIME value, to 0.1 s.
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

usage() {
  echo "usage: $0 {start|stop|status} DIR" >&2
  exit 2
}

# --- helpers -----------------------------------------------------------------

# Two distinct free TCP ports, free on 127.0.0.1 and on $ADDR (the monitor
# binds the first on loopback, radosgw the second on $ADDR), chosen at random *below* the
# kernel's ephemeral range: ports from that range (what bind(0) returns) are
# also handed to outgoing connections, and the cluster makes many while it
# starts, one of which could take the port before radosgw binds it. Both
# sockets are held while choosing, so the two differ. A race with some other
# program remains; start then fails with a message naming the port.
free_ports() {
  python3 - "$ADDR" <<'EOF'
import random, socket, sys
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
addresses = sorted({"127.0.0.1", sys.argv[1]})
ports, socks = [], []
while len(ports) < 2:
    p = random.randint(10000, lo - 1)   # far from Ceph's OSD ports, 6800-7300
    held = []
    try:
        for address in addresses:
            held.append(socket.socket())
            held[-1].bind((address, p))
    except OSError:
        for s in held:
            s.close()
        continue
    socks += held
    ports.append(p)
print(*ports)
EOF
}

# ceph CLI against this cluster; --connect-timeout plus timeout(1) so that a
# monitor that is down never makes us hang.
ceph_cli() {
  timeout 30 ceph -c "$CONF" --connect-timeout 10 "$@"
}

# pid of daemon NAME from its pid file, or nothing.
pid_of() {
  local f="$DIR/run/$1.pid"
  if [[ -s $f ]]; then tr -dc '0-9' <"$f"; fi
}

# True if PID is alive and is one of *this* instance's daemons (its command line
# names our ceph.conf), which guards against pid reuse after a crash.
is_ours() {
  local pid=$1
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  local arg args=()
  mapfile -d '' args 2>/dev/null </proc/"$pid"/cmdline || return 1
  for arg in "${args[@]}"; do
    [[ $arg == "$CONF" ]] && return 0
  done
  return 1
}

# True while PID runs. A daemon that exited but is not yet reaped (a zombie)
# counts as gone: the daemons fork into the background, so their parent is
# pid 1, and some init processes (e.g. the one in a Firecracker VM) reap only
# every second or two.
alive() {
  local stat
  stat=$(cat /proc/"$1"/stat 2>/dev/null) || return 1
  stat=${stat##*) }   # the field after "(comm) " is the state
  [[ ${stat:0:1} != Z ]]
}

# All live processes whose command line names our ceph.conf: the daemons from
# their pid files, plus any that died before writing one or lost it.
our_pids() {
  local p pids=()
  for p in mon."$MON_ID" osd.0 "$RGW_NAME"; do
    p=$(pid_of "$p")
    is_ours "$p" && pids+=("$p")
  done
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [[ $p == "$$" ]] && continue
    is_ours "$p" && pids+=("$p")
  done
  if ((${#pids[@]})); then printf '%s\n' "${pids[@]}" | sort -un; fi
}

# wait_for SECONDS WHAT LOGFILE PID CMD...: poll CMD until it succeeds. Fails
# early if daemon PID exits, and after SECONDS; either way names LOGFILE.
wait_for() {
  local secs=$1 what=$2 logf=$3 pid=$4
  shift 4
  local deadline
  deadline=$(deadline_in "$secs")
  until "$@" >/dev/null 2>&1; do
    if [[ -n $pid ]] && ! alive "$pid"; then
      die_log "$logf" "$what: the daemon (pid $pid) exited; read $logf"
    fi
    if (($(now_us) >= deadline)); then
      die_log "$logf" "$what: not ready after ${secs}s; read $logf"
    fi
    sleep 0.2
  done
}

# Daemons write their pid file right after forking into the background.
wait_pid_file() {
  local name=$1 logf=$2 deadline
  deadline=$(deadline_in 10)
  until [[ -s $DIR/run/$name.pid ]]; do
    (($(now_us) < deadline)) || die "$name wrote no pid file $DIR/run/$name.pid; read $logf"
    sleep 0.1
  done
  pid_of "$name"
}

# --- start -------------------------------------------------------------------

write_conf() {
  local fsid=$1 mon_port=$2 rgw_port=$3
  cat >"$CONF" <<EOF
$MARKER
[global]
fsid = $fsid
# Monitor speaks only msgr2, on a port picked at start.
mon host = [v2:127.0.0.1:$mon_port]
public addr = 127.0.0.1
# Else the OSD's heartbeat ports listen on 0.0.0.0.
cluster addr = 127.0.0.1
ms bind ipv6 = false

# No cephx: no keyrings to create or distribute.
auth cluster required = none
auth service required = none
auth client required = none
# radosgw overrides two built-in defaults unless the config sets them: it
# asks for cephx (auth_client_required, set above) and for msgr2 "secure" mode
# to the monitor, which needs cephx session keys. Without crc here it cannot
# authenticate and blocks for client_mount_timeout (300 s), then exits with
# "failed to fetch mon config". (mon, osd and the ceph CLI already allow crc.)
ms mon client mode = crc

# Keep every file this cluster writes under $DIR.
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
mon cluster log file = default=$DIR/log/\$cluster.\$channel.log cluster=$DIR/log/\$cluster.log
crash dir = $DIR/crash
mon data = $DIR/mon/\$cluster-\$id
osd data = $DIR/osd/\$cluster-\$id
rgw data = $DIR/rgw/\$cluster-\$id
# Do not read keyrings from /etc/ceph (cephx is off anyway).
keyring = $DIR/keyring

# One OSD, so one copy of everything.
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
# RGW creates 7 pools; few PGs each keeps peering fast and stays far below
# mon_max_pg_per_osd. No manager daemon runs, so the autoscaler is off.
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon warn on pool no redundancy = false

# The monitor refuses to start (or shuts down) when the disk holding its
# data has less than this percentage free; a test machine's disk may be full-ish.
mon data avail crit = 0
mon data avail warn = 0
# Each pool RGW creates is one osdmap change; the monitor batches changes for
# up to 1 s by default, which adds ~1 s per pool to the start.
paxos propose interval = 0.1

[osd]
# Objects live in the OSD's memory (its RSS grows with the data stored, up to
# memstore device bytes); no disk to format, and fast.
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES

[$RGW_NAME]
rgw frontends = beast endpoint=$ADDR:$rgw_port
# 32 request threads instead of 512: ~480 fewer threads, ~8 MB less RSS.
# Beast runs requests as coroutines, so more than 32 can still be in flight.
rgw thread pool size = 32
EOF
}

# launch NAME CMD...: start a daemon that forks into the background; print its
# pid. Its foreground part first fetches config from the monitor and would
# wait up to 300 s for an unreachable one, hence the timeout.
launch() {
  local name=$1 rc=0
  shift
  timeout "$TIMEOUT" "$@" >>"$DIR/log/$name.out" 2>&1 || rc=$?
  if ((rc == 124)); then
    die_log "$DIR/log/$name.log" "$name did not start within ${TIMEOUT}s; read $DIR/log/$name.out and $DIR/log/$name.log"
  elif ((rc != 0)); then
    die_log "$DIR/log/$name.log" "$name failed to start (exit $rc); read $DIR/log/$name.out and $DIR/log/$name.log"
  fi
  wait_pid_file "$name" "$DIR/log/$name.log"
}

start_mon() {
  local fsid=$1 mon_port=$2 logf="$DIR/log/mon.$MON_ID.log"
  monmaptool --create --clobber --fsid "$fsid" \
    --addv "$MON_ID" "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
  timeout "$TIMEOUT" ceph-mon -c "$CONF" -i "$MON_ID" --mkfs --monmap "$DIR/monmap" \
    >>"$DIR/log/mon.$MON_ID.out" 2>&1 \
    || die "ceph-mon --mkfs failed; read $DIR/log/mon.$MON_ID.out and $logf"
  local pid
  pid=$(launch "mon.$MON_ID" ceph-mon -c "$CONF" -i "$MON_ID")
  wait_for "$TIMEOUT" "monitor" "$logf" "$pid" ceph_cli mon stat
}

osd_up() {
  ceph_cli osd stat -f json | grep -q '"num_up_osds":1[,}]'
}

start_osd() {
  local logf="$DIR/log/osd.0.log" uuid id pid
  uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(ceph_cli osd new "$uuid") || die "'ceph osd new' failed; read $DIR/log/mon.$MON_ID.log"
  [[ $id == 0 ]] || die "expected OSD id 0, got '$id'"
  mkdir -p "$DIR/osd/ceph-0"
  timeout "$TIMEOUT" ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" \
    >>"$DIR/log/osd.0.out" 2>&1 \
    || die "ceph-osd --mkfs failed; read $DIR/log/osd.0.out and $logf"
  # launch keeps its stderr chatter ("Falling back to public interface": no
  # cluster network is configured, as intended) out of the caller's output.
  pid=$(launch osd.0 ceph-osd -c "$CONF" -i 0)
  wait_for "$TIMEOUT" "OSD" "$logf" "$pid" osd_up
}

# Anything that answers HTTP on the port (anonymous GET / gives 200).
rgw_http_up() {
  curl -s -o /dev/null --max-time 2 "http://$ADDR:$1/"
}

# A signed request with the test user's key to URL $1 succeeds (ListBuckets). curl 7.88
# does not send x-amz-content-sha256 by itself and RGW then rejects the
# signature (SignatureDoesNotMatch); given the header, curl signs it and uses
# its value as the payload hash.
rgw_signed_ok() {
  curl -sf -o /dev/null --max-time 5 --aws-sigv4 "aws:amz:$REGION:s3" \
    --user "$ACCESS_KEY:$SECRET_KEY" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD" \
    "$1"
}

start_rgw() {
  local rgw_port=$1 logf="$DIR/log/$RGW_NAME.log" pid
  pid=$(launch "$RGW_NAME" radosgw -c "$CONF" -n "$RGW_NAME")
  # On first start radosgw creates its zone and 4 pools before it opens the
  # port (3 more come with the first bucket, which takes ~0.3 s longer).
  wait_for "$TIMEOUT" "radosgw on port $rgw_port" "$logf" "$pid" rgw_http_up "$rgw_port"
  timeout "$TIMEOUT" radosgw-admin -c "$CONF" user create --uid="$S3_USER" \
    --display-name="tests/s3" --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" \
    >"$DIR/log/user-create.json" 2>>"$DIR/log/radosgw-admin.out" \
    || die "radosgw-admin user create failed; read $DIR/log/radosgw-admin.out and $DIR/log/client.admin.log"
  wait_for "$TIMEOUT" "signed S3 request" "$logf" "$pid" rgw_signed_ok "http://$ADDR:$rgw_port/"
}

on_start_failure() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    log "start failed; stopping what was started (logs kept in $DIR/log; 'rgw.sh stop $DIR' removes $DIR)"
    stop_daemons || true
  fi
  exit "$rc"
}

cmd_start() {
  [[ $(id -u) == 0 ]] || die "run as root (the Ceph daemons here are started as root)"
  [[ $ADDR =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "RGW_ADDR='$ADDR' is not an IPv4 address"
  [[ $ADDR == 127.0.0.1 ]] || ip -4 -o addr show | grep -qF " $ADDR/" \
    || die "RGW_ADDR=$ADDR is not an address of this host (ip -4 addr lists none such); bring its interface up first (scripts/cluster.sh up does)"
  local t0=$EPOCHREALTIME
  if [[ -e $DIR ]]; then
    [[ -d $DIR && -z $(ls -A "$DIR") ]] || die "$DIR exists and is not empty (stop it first, or pick another DIR)"
  fi
  mkdir -p "$DIR"/{run,log,crash,mon,osd,rgw}
  trap on_start_failure EXIT
  trap 'exit 130' INT TERM   # Ctrl-C: still run on_start_failure

  local mon_port rgw_port fsid
  read -r mon_port rgw_port < <(free_ports)
  fsid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$fsid" "$mon_port" "$rgw_port"

  start_mon "$fsid" "$mon_port"
  log "monitor up after $(elapsed "$t0")s"
  start_osd
  log "OSD up after $(elapsed "$t0")s"
  start_rgw "$rgw_port"

  cat >"$DIR/env" <<EOF
AWS_ENDPOINT_URL=http://$ADDR:$rgw_port
AWS_ACCESS_KEY_ID=$ACCESS_KEY
AWS_SECRET_ACCESS_KEY=$SECRET_KEY
AWS_REGION=$REGION
EOF
  trap - EXIT INT TERM
  log "started in $(elapsed "$t0")s (monitor 127.0.0.1:$mon_port, S3 http://$ADDR:$rgw_port)"
  cat "$DIR/env"
}

# --- stop --------------------------------------------------------------------

# wait_gone PID SECONDS: wait until PID has exited; false if it still runs.
wait_gone() {
  local deadline
  deadline=$(deadline_in "$2")
  while alive "$1"; do
    (($(now_us) < deadline)) || return 1
    sleep 0.05
  done
}

# stop_pid NAME PID: SIGTERM, wait up to TIMEOUT, then SIGKILL and wait again.
stop_pid() {
  local name=$1 pid=$2 t=$EPOCHREALTIME
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" "$TIMEOUT"; then
    log "$name (pid $pid) still running ${TIMEOUT}s after SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "$name (pid $pid) survived SIGKILL"
  fi
  log "$name exited after $(elapsed "$t")s"
}

# Stop radosgw first and the monitor last, so that no daemon spends its
# shutdown looking for one that is already gone. Then anything else of this
# instance (a daemon that lost its pid file, a leftover radosgw-admin).
stop_daemons() {
  local name pid
  for name in "$RGW_NAME" osd.0 mon."$MON_ID"; do
    pid=$(pid_of "$name")
    if is_ours "$pid"; then stop_pid "$name" "$pid"; fi
  done
  for pid in $(our_pids); do
    stop_pid "leftover process $(tr '\0' ' ' </proc/"$pid"/cmdline 2>/dev/null)" "$pid"
  done
}

cmd_stop() {
  local t0=$EPOCHREALTIME
  [[ -e $DIR ]] || { log "$DIR does not exist; nothing to stop"; return 0; }
  # Refuse to rm -rf a directory this script did not create.
  if [[ -n $(ls -A "$DIR") ]] && ! grep -qxF "$MARKER" "$CONF" 2>/dev/null; then
    die "$DIR has no $CONF written by this script; not touching it"
  fi
  stop_daemons
  rm -rf -- "$DIR"
  log "stopped and removed $DIR in $(elapsed "$t0")s"
}

# --- status ------------------------------------------------------------------

cmd_status() {
  [[ -f $CONF ]] || die "no instance in $DIR ($CONF missing)"
  local name pid ok=0
  for name in mon."$MON_ID" osd.0 "$RGW_NAME"; do
    pid=$(pid_of "$name")
    if is_ours "$pid"; then
      echo "$name: running (pid $pid)"
    else
      echo "$name: not running (log: $DIR/log/$name.log)"
      ok=1
    fi
  done
  if [[ -f $DIR/env ]]; then
    local endpoint
    endpoint=$(sed -n 's/^AWS_ENDPOINT_URL=//p' "$DIR/env")
    if rgw_signed_ok "$endpoint/"; then
      echo "s3: $endpoint answers signed requests"
    else
      echo "s3: $endpoint does not answer signed requests"
      ok=1
    fi
    cat "$DIR/env"
  else
    echo "s3: no $DIR/env (start did not finish)"
    ok=1
  fi
  return "$ok"
}

# --- main --------------------------------------------------------------------

(($# == 2)) || usage
DIR=$2
[[ -n $DIR ]] || usage
DIR=$(realpath -m -- "$DIR")
[[ $DIR != / ]] || die "refusing to use / as DIR"
CONF="$DIR/ceph.conf"

case $1 in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) usage ;;
esac
