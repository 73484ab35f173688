#!/usr/bin/env bash
# A cluster on one host, for tests and demos of multi-node jobs: N "nodes", each a network
# namespace with its own address on a bridge, its own node-local cache directory and its own
# /dev/shm; optionally the test suite's S3 server (Ceph RGW, tests/s3/rgw.sh) listening on the
# bridge, where every node reaches it.
#
#   scripts/cluster.sh up N [--s3]     create the bridge and N nodes (and start S3)
#   scripts/cluster.sh exec I CMD...   run CMD on node I (0-based), in its namespace
#   scripts/cluster.sh status          the nodes, their addresses and processes, S3
#   scripts/cluster.sh down            stop every process in the nodes, remove it all
#   scripts/cluster.sh demo [N]        the multi-node job of docs/scale.md in one command: up N
#                                      (default 3) --s3, a data set in a bucket, 2 ranks a node
#                                      under torchrun for 2 epochs, rank 0's table; then down
#
# What a node is: network namespace NAME-I, whose eth0 (a veth whose other end is on bridge
# NAMEbr) has address SUBNET.(11+I)/24; the bridge has SUBNET.1. Namespaces reach each other and
# the bridge address, nothing else (no route out, no forwarding). Everything else is shared with
# the host (file system, processes, CPUs), except:
#   - DIR/node-I/cache: the node's cache directory (ZEROWAIT_CACHE_DIR), so the node-local block
#     cache (docs/cache.md) is one per node, shared by that node's processes;
#   - DIR/node-I/shm: a tmpfs of its own (ZW_CLUSTER_SHM_BYTES, default 256 MiB), mounted over
#     /dev/shm for every command `exec` runs on the node (in the mount namespace `ip netns exec`
#     makes, which does not spread mounts back to the host);
#   - DIR/node-I/tmp: TMPDIR (spool files of uploads to S3).
# `exec` also sets ZW_CLUSTER_NODE (I), ZW_CLUSTER_NODES (N), ZW_CLUSTER_ADDR (the node's
# address), ZW_CLUSTER_MASTER_ADDR (node 0's), ZW_CLUSTER_DIR, GLOO_SOCKET_IFNAME=eth0 (every
# namespace has the host's hostname, which resolves to an address no namespace reaches) and,
# with --s3, the AWS_* settings of the S3 server (DIR/s3/env).
#
# Environment: ZW_CLUSTER_NAME (default zwc; up to 8 of [a-z0-9], names the namespaces and
# interfaces, so several clusters can coexist), ZW_CLUSTER_DIR (default /tmp/zw-cluster-NAME),
# ZW_CLUSTER_SUBNET (three octets, default the first 10.77.X that no route or address of the
# host overlaps), ZW_CLUSTER_SHM_BYTES, ZW_CLUSTER_TIMEOUT (seconds `down` waits for processes
# after SIGTERM before SIGKILL, default 10).
#
# Needs root and iproute2 (ip netns); --s3 needs what tests/s3/rgw.sh needs.

set -euo pipefail

readonly NAME="${ZW_CLUSTER_NAME:-zwc}"
readonly DIR="${ZW_CLUSTER_DIR:-/tmp/zw-cluster-$NAME}"
readonly SHM_BYTES="${ZW_CLUSTER_SHM_BYTES:-268435456}"
readonly STOP_TIMEOUT="${ZW_CLUSTER_TIMEOUT:-10}"
readonly BRIDGE="${NAME}br"
readonly STATE="$DIR/cluster.env"
readonly REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly RGW="$REPO/tests/s3/rgw.sh"
readonly MAX_NODES=200

log() { echo "cluster.sh: $*" >&2; }
die() { echo "cluster.sh: error: $*" >&2; exit 1; }

usage() {
  grep '^#   scripts/cluster.sh' "${BASH_SOURCE[0]}" | sed 's/^# *//' >&2
  exit 2
}

require_root_and_ip() {
  [[ $(id -u) == 0 ]] || die "run as root: creating network namespaces, a bridge and mounts needs it"
  command -v ip >/dev/null || die "no 'ip' command: install iproute2"
  [[ $NAME =~ ^[a-z0-9]{1,8}$ ]] \
    || die "ZW_CLUSTER_NAME='$NAME': use 1 to 8 of [a-z0-9] (interface names are at most 15 characters)"
}

namespace() { echo "$NAME-$1"; }
host_veth() { echo "${NAME}v$1"; }

# The first 10.77.X (X = 0..255) whose /24 overlaps no route (any table) and no address of
# the host, so the cluster's traffic never goes where the host's network does.
free_subnet() {
  { ip -4 -o route show table all 2>/dev/null; ip -4 -o addr show 2>/dev/null; } | python3 -c '
import ipaddress, re, sys
used = []
for line in sys.stdin:
    for word in line.split():
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", word):
            used.append(ipaddress.ip_network(word, strict=False))
for x in range(256):
    net = ipaddress.ip_network(f"10.77.{x}.0/24")
    if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
        print(f"10.77.{x}")
        break
else:
    sys.exit("every 10.77.X.0/24 overlaps a route or address of this host; set ZW_CLUSTER_SUBNET")
'
}

load_state() {
  [[ -f $STATE ]] || die "no cluster '$NAME' is up ($STATE missing): scripts/cluster.sh up N"
  # shellcheck disable=SC1090
  . "$STATE"
}

# --- up ----------------------------------------------------------------------

on_up_failure() {
  local rc=$?
  trap - EXIT
  if ((rc != 0)); then
    log "up failed; removing what was created"
    cmd_down >/dev/null 2>&1 || true
  fi
  exit "$rc"
}

cmd_up() {
  (($# >= 1)) || usage
  local nodes=$1 s3=0
  shift
  while (($#)); do
    case $1 in
      --s3) s3=1 ;;
      *) usage ;;
    esac
    shift
  done
  [[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= MAX_NODES)) \
    || die "N='$nodes': give a number of nodes from 1 to $MAX_NODES"
  require_root_and_ip
  [[ ! -e $STATE ]] || die "cluster '$NAME' is already up ($STATE): scripts/cluster.sh down first"
  if ip link show "$BRIDGE" >/dev/null 2>&1 || ip netns list | grep -q "^$NAME-[0-9]"; then
    die "leftovers of cluster '$NAME' exist (bridge $BRIDGE or namespaces $NAME-*):" \
      "scripts/cluster.sh down removes them"
  fi
  if ((s3)); then
    [[ -x $RGW ]] || die "$RGW missing: --s3 starts the test suite's S3 server with it"
  fi
  # Two clusters coming up at once must not both take the first free subnet.
  exec 9>/tmp/zw-cluster.lock
  flock -w 60 9 || die "another scripts/cluster.sh up held /tmp/zw-cluster.lock for 60 s"
  local subnet="${ZW_CLUSTER_SUBNET:-}"
  [[ -n $subnet ]] || subnet=$(free_subnet)
  [[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "ZW_CLUSTER_SUBNET='$subnet': give three octets, e.g. 10.77.0"

  trap on_up_failure EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$DIR"
  cat >"$STATE" <<EOF
# created by scripts/cluster.sh
NODES=$nodes
SUBNET=$subnet
BRIDGE_ADDR=$subnet.1
EOF
  ip link add "$BRIDGE" type bridge
  ip addr add "$subnet.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local i ns
  for ((i = 0; i < nodes; i++)); do
    ns=$(namespace "$i")
    ip netns add "$ns"
    ip link add "$(host_veth "$i")" type veth peer name eth0 netns "$ns"
    ip link set "$(host_veth "$i")" master "$BRIDGE" up
    ip -n "$ns" addr add "$subnet.$((11 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    mkdir -p "$DIR/node-$i"/{cache,shm,tmp}
    mount -t tmpfs -o "size=$SHM_BYTES,mode=1777" "$ns-shm" "$DIR/node-$i/shm"
  done
  exec 9>&-  # the bridge holds the subnet now
  if ((s3)); then
    RGW_ADDR="$subnet.1" timeout 300 bash "$RGW" start "$DIR/s3" >/dev/null
  fi
  trap - EXIT INT TERM
  log "up: $nodes nodes $(namespace 0)..$(namespace $((nodes - 1)))" \
    "at $subnet.11-$subnet.$((10 + nodes)) on bridge $BRIDGE ($subnet.1), state in $DIR"
  if ((s3)); then log "S3: $(sed -n 's/^AWS_ENDPOINT_URL=//p' "$DIR/s3/env")"; fi
}

# --- exec --------------------------------------------------------------------

cmd_exec() {
  (($# >= 2)) || usage
  local i=$1
  shift
  require_root_and_ip
  load_state
  [[ $i =~ ^[0-9]+$ ]] && ((i < NODES)) || die "node '$i': this cluster has nodes 0 to $((NODES - 1))"
  local ns envs=()
  ns=$(namespace "$i")
  envs=(ZW_CLUSTER_NODE="$i" ZW_CLUSTER_NODES="$NODES" ZW_CLUSTER_ADDR="$SUBNET.$((11 + i))"
        ZW_CLUSTER_MASTER_ADDR="$SUBNET.11" ZW_CLUSTER_DIR="$DIR"
        ZEROWAIT_CACHE_DIR="$DIR/node-$i/cache" TMPDIR="$DIR/node-$i/tmp"
        GLOO_SOCKET_IFNAME=eth0)
  if [[ -f $DIR/s3/env ]]; then
    mapfile -t -O "${#envs[@]}" envs < <(grep '^AWS_' "$DIR/s3/env")
  fi
  # `ip netns exec` runs the command in a mount namespace of its own, so the bind mount of the
  # node's /dev/shm stays inside it; exec keeps the command's pid that of the caller's child.
  exec ip netns exec "$ns" env "${envs[@]}" sh -c 'mount --bind "$1" /dev/shm && shift && exec "$@"' \
    sh "$DIR/node-$i/shm" "$@"
}

# --- status ------------------------------------------------------------------

cmd_status() {
  require_root_and_ip
  load_state
  echo "cluster '$NAME': $NODES nodes on bridge $BRIDGE ($BRIDGE_ADDR), state in $DIR"
  local i ns pids ok=0
  for ((i = 0; i < NODES; i++)); do
    ns=$(namespace "$i")
    if ip netns list | grep -q "^$ns\b"; then
      pids=$(ip netns pids "$ns" | wc -l)
      echo "node $i: $ns $SUBNET.$((11 + i)), $pids processes, cache $(du -sh "$DIR/node-$i/cache" | cut -f1)"
    else
      echo "node $i: $ns missing"
      ok=1
    fi
  done
  if [[ -d $DIR/s3 ]]; then
    bash "$RGW" status "$DIR/s3" | sed 's/^/s3 /' || ok=1
  fi
  return "$ok"
}

# --- down --------------------------------------------------------------------

# Every process in the namespaces NAME-*: SIGTERM, up to STOP_TIMEOUT seconds, then SIGKILL.
stop_processes() {
  local ns pids=() deadline
  for ns in $(ip netns list | awk '{print $1}' | grep "^$NAME-[0-9]*$" || true); do
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns")
  done
  ((${#pids[@]})) || return 0
  log "stopping ${#pids[@]} processes still running in the nodes"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  deadline=$((SECONDS + STOP_TIMEOUT))
  while ((SECONDS < deadline)); do
    local alive=()
    for p in "${pids[@]}"; do
      [[ -d /proc/$p ]] && alive+=("$p")
    done
    ((${#alive[@]})) || return 0
    sleep 0.2
  done
  log "sending SIGKILL to what outlived SIGTERM by ${STOP_TIMEOUT}s"
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

# Idempotent: removes whatever of cluster NAME exists, and says what it did.
cmd_down() {
  require_root_and_ip
  stop_processes
  if [[ -d $DIR/s3 ]]; then
    timeout 300 bash "$RGW" stop "$DIR/s3" >/dev/null 2>&1 \
      || log "stopping S3 in $DIR/s3 failed; try: bash $RGW stop $DIR/s3"
  fi
  local ns link m removed=0
  for ns in $(ip netns list | awk '{print $1}' | grep "^$NAME-[0-9]*$" || true); do
    ip netns del "$ns"
    removed=$((removed + 1))
  done
  for link in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' \
                 | grep -E "^(${NAME}br|${NAME}v[0-9]+)$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  for m in "$DIR"/node-*/shm; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m"; fi
  done
  if [[ -d $DIR ]]; then
    # Only a directory this script made: its state file, or nothing but node folders.
    if [[ -f $STATE ]] && grep -qx '# created by scripts/cluster.sh' "$STATE"; then
      rm -rf -- "$DIR"
    else
      log "left $DIR in place: it has no $STATE written by this script"
    fi
  fi
  log "down: cluster '$NAME' removed ($removed namespaces)"
}

# --- demo --------------------------------------------------------------------

# The job of docs/scale.md ("A multi-node job") from a fresh setup: examples/multinode_train.py
# on N nodes x 2 ranks, its data set and checkpoints in a bucket of the cluster's S3 server. The
# cluster is removed at the end, whatever happens; the job's logs stay in DIR_OUT.
cmd_demo() {
  local nodes=${1:-3}
  [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "demo: N must be a number of nodes, not '$nodes'"
  require_root_and_ip
  local py="$REPO/.venv/bin/python"
  [[ -x $py ]] || py=$(command -v python3)
  local out="${ZW_CLUSTER_DEMO_OUT:-/tmp/zw-cluster-demo}"
  rm -rf "$out" && mkdir -p "$out"
  "$0" up "$nodes" --s3
  trap '"$0" down' EXIT
  set -a && . "$DIR/s3/env" && set +a
  # A bucket: one SigV4-signed PUT (RGW wants the payload's hash, which curl signs but omits).
  curl -sS --fail --max-time 30 -X PUT "$AWS_ENDPOINT_URL/demo" \
    --aws-sigv4 "aws:amz:${AWS_REGION:-us-east-1}:s3" \
    --user "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY" \
    -H "x-amz-content-sha256: $(printf '' | sha256sum | cut -d' ' -f1)" >/dev/null
  "$0" exec 0 "$py" "$REPO/examples/multinode_train.py" generate --out s3://demo/ds
  local i pids=() failed=0
  for ((i = 0; i < nodes; i++)); do
    # torchrun's address and the rendezvous host said outright: every namespace has the host's
    # hostname, which resolves to an address no node reaches (docs/scale.md).
    "$0" exec "$i" sh -c 'exec "$0" -m torch.distributed.run --nnodes "$ZW_CLUSTER_NODES" \
        --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "$ZW_CLUSTER_MASTER_ADDR:29400" \
        --rdzv-id demo --rdzv-conf "is_host=$((ZW_CLUSTER_NODE == 0))" \
        --local-addr "$ZW_CLUSTER_ADDR" --max-restarts 1 "$1" train --data s3://demo/ds \
        --ckpt "$2/ckpt" --mirror s3://demo/ckpt --out "$2/run" --epochs 2' \
      "$py" "$REPO/examples/multinode_train.py" "$out" >"$out/node-$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { failed=1; log "demo: node $i failed: $out/node-$i.log"; }
  done
  cat "$out/node-0.log"
  ((failed == 0)) || die "demo: the job failed (logs in $out)"
  log "demo: done; each rank's keys, cache counters and profile are in $out/run"
}

(($# >= 1)) || usage
command=$1
shift
case $command in
  up) cmd_up "$@" ;;
  exec) cmd_exec "$@" ;;
  status) (($# == 0)) || usage; cmd_status ;;
  down) (($# == 0)) || usage; cmd_down ;;
  demo) (($# <= 1)) || usage; cmd_demo "$@" ;;
  *) usage ;;
esac
