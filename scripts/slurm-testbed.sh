#!/usr/bin/env bash
# A real Slurm cluster on one machine: slurmctld and one slurmd per node, each node a network
# namespace (the project's multi-node test setup), joined by a bridge. Needs root, iproute2,
# unshare and Debian's slurmctld/slurmd/slurm-client (scripts/setup.sh installs them).
#
#   scripts/slurm-testbed.sh check                 # why it cannot run here (exit 1), or nothing
#   scripts/slurm-testbed.sh start DIR [NODES]     # NODES (default 3): node0..node<N-1>
#   scripts/slurm-testbed.sh login DIR CMD [ARGS]  # CMD on the login node: srun, sbatch, sinfo...
#   scripts/slurm-testbed.sh stop DIR              # every process and namespace gone
#
# With SLURM_TESTBED_OWNER=PID in start's environment, the test bed is stopped when process
# PID ends, whatever way it ends.
#
# DIR (created; empty or absent) holds slurm.conf, the daemons' state, spool and logs. The
# login node "login" (10.79.1.254, on the bridge) runs slurmctld and the client commands; node i
# is "node<i>" at 10.79.1.<i+1>, with 4 CPUs, 2 GPUs (gres with no device behind them) and host
# name node<i>; every namespace's /etc/hosts names them all. Authentication is Slurm's auth/none
# (no munge): the daemons trust any local user, which is fine for a test bed and nowhere else.
# `start` returns once sinfo shows every node idle; `stop` kills every process left in the
# namespaces (job steps included).
set -euo pipefail

subnet=10.79.1
login_addr=$subnet.254

die() {
  echo "slurm-testbed: $*" >&2
  exit 1
}

# Why the test bed cannot run here; empty when it can.
why_not() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (network namespaces, slurmd)"; return; }
  command -v ip >/dev/null || { echo "needs iproute2 (ip netns)"; return; }
  command -v unshare >/dev/null && command -v nsenter >/dev/null ||
    { echo "needs unshare(1) and nsenter(1) (util-linux)"; return; }
  local tool
  for tool in slurmctld slurmd srun sbatch sinfo scontrol; do
    command -v $tool >/dev/null ||
      { echo "needs $tool (apt-get install slurmctld slurmd slurm-client; scripts/setup.sh)"; return; }
  done
  ip netns list >/dev/null 2>&1 || { echo "\`ip netns\` does not work here"; return; }
  # A container may allow neither (no CAP_SYS_ADMIN): try both once.
  local probe="tslmcheck$$"
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace here"; return; }
  ip netns del "$probe"
  unshare --mount --uts true 2>/dev/null ||
    { echo "cannot create mount and UTS namespaces here (unshare)"; return; }
}

# ns_of DIR NAME: the namespace of node NAME (or "login") of the test bed in DIR.
ns_of() { echo "$(cat "$1/prefix")$2"; }

# in_ns DIR NAME CMD...: CMD in node NAME's network namespace, with host name NAME, the test
# bed's /etc/hosts, a private DIR/tmp (Slurm's TmpFS: node-local on a real cluster; PMIx keeps
# per-step folders there) and SLURM_CONF set. nsenter rather than `ip netns exec`, which remounts
# /sys and so hides the cgroup file systems slurmd insists on finding (even with
# proctrack/linuxproc).
in_ns() {
  local dir=$1 name=$2
  shift 2
  mkdir -p "$dir/tmp.$name"
  exec nsenter --net="/run/netns/$(ns_of "$dir" "$name")" unshare --mount --uts \
    env SLURM_CONF="$dir/slurm.conf" sh -c \
    'mount --bind "$0/hosts" /etc/hosts && mount --bind "$0/tmp.$1" "$0/tmp" &&
     hostname "$1" && shift && exec "$@"' "$dir" "$name" "$@"
}

write_conf() {
  local dir=$1 nodes=$2 i
  cat >"$dir/slurm.conf" <<EOF
# Written by scripts/slurm-testbed.sh for a test bed in $dir.
ClusterName=tessel-testbed
SlurmctldHost=login($login_addr)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/spool/%n/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
TmpFS=$dir/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SlurmdParameters=config_overrides
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=300
MessageTimeout=10
SlurmctldDebug=info
SlurmdDebug=info
EOF
  # Two GPUs per node as a generic resource with no devices behind it: enough for Slurm to
  # allocate them (--gpus-per-node) and set SLURM_GPUS_ON_NODE; nothing can run on them.
  echo "GresTypes=gpu" >>"$dir/slurm.conf"
  for ((i = 0; i < nodes; i++)); do
    echo "NodeName=node$i NodeAddr=$subnet.$((i + 1)) CPUs=4 RealMemory=2000 Gres=gpu:2" \
      "State=UNKNOWN" >>"$dir/slurm.conf"
  done
  # Slurm 22.05 drops GPUs without a device file: two nodes like /dev/null's stand in.
  mkdir -p "$dir/dev" && mknod "$dir/dev/gpu0" c 1 3 && mknod "$dir/dev/gpu1" c 1 3
  printf 'AutoDetect=off\nNodeName=node[0-%d] Name=gpu File=%s/dev/gpu[0-1]\n' $((nodes - 1)) \
    "$dir" >"$dir/gres.conf"
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$dir/slurm.conf"
}

start() {
  local dir=$1 nodes=${2:-3} why i ns
  why=$(why_not)
  [[ -z $why ]] || die "$why"
  [[ $nodes =~ ^[1-9][0-9]?$ && $nodes -le 200 ]] || die "NODES '$nodes' is not 1..200"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  [[ -z $(ls -A "$dir") ]] || die "$dir is not empty"
  mkdir -p "$dir"/{state,spool,log,tmp}
  echo "tslm$$-" >"$dir/prefix"
  echo "$nodes" >"$dir/nodes"
  write_conf "$dir" "$nodes"

  # The login namespace holds the bridge (the "switch") and the controller's address.
  ns=$(ns_of "$dir" login)
  echo "$ns" >"$dir/namespaces"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add br0 type bridge
  ip -n "$ns" addr add "$login_addr/24" dev br0
  ip -n "$ns" link set br0 up
  {
    echo "127.0.0.1 localhost"
    echo "$login_addr login"
    for ((i = 0; i < nodes; i++)); do echo "$subnet.$((i + 1)) node$i"; done
  } >"$dir/hosts"
  for ((i = 0; i < nodes; i++)); do
    ns=$(ns_of "$dir" "node$i")
    echo "$ns" >>"$dir/namespaces"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add eth0 type veth peer name "p$i" netns "$(ns_of "$dir" login)"
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$(ns_of "$dir" login)" link set "p$i" master br0
    ip -n "$(ns_of "$dir" login)" link set "p$i" up
  done

  # -D: in the foreground (as the namespace's process), so `stop` finds every daemon by
  # namespace; -i: ignore state from an earlier run (there is none in a fresh DIR).
  in_ns "$dir" login slurmctld -D -i >"$dir/log/slurmctld.out" 2>&1 &
  for ((i = 0; i < nodes; i++)); do
    mkdir -p "$dir/spool/node$i"
    in_ns "$dir" "node$i" slurmd -D -N "node$i" >"$dir/log/slurmd.node$i.out" 2>&1 &
  done
  # With SLURM_TESTBED_OWNER=PID (a test process), the test bed goes when that process does,
  # even when it is killed before it can call `stop` (a ctest timeout).
  if [[ -n ${SLURM_TESTBED_OWNER:-} ]]; then
    (
      tail --pid="$SLURM_TESTBED_OWNER" -f /dev/null
      stop "$dir"
    ) </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/reaper.pid"
  fi
  # Every node idle (sinfo reports one line per state; "idle" alone means all are). About a
  # second on an idle machine; the bound is for a loaded one.
  local deadline=$((SECONDS + 90)) states=""
  while ((SECONDS < deadline)); do
    states=$(in_ns "$dir" login sinfo -h -o '%T %D' 2>/dev/null || true)
    [[ $states == "idle $nodes" ]] && { echo "slurm-testbed: $nodes nodes idle in $dir"; return; }
    sleep 0.1
  done
  echo "slurm-testbed: nodes not idle after 90 s (sinfo: ${states:-no answer}); logs in $dir/log" >&2
  stop "$dir"
  exit 1
}

stop() {
  local dir=$1 ns pids round reaper
  [[ -f $dir/namespaces ]] || return 0
  # The owner's reaper (see start), unless this is it.
  if [[ -f $dir/reaper.pid ]]; then
    reaper=$(cat "$dir/reaper.pid")
    rm -f "$dir/reaper.pid"
    [[ $reaper == "$BASHPID" ]] || pkill -P "$reaper" 2>/dev/null || true
    [[ $reaper == "$BASHPID" ]] || kill "$reaper" 2>/dev/null || true
  fi
  # Everything in the namespaces: daemons, slurmstepd, job steps. TERM first so slurmctld saves
  # nothing half-written, then KILL whatever is left; wait until the namespaces are empty.
  for round in TERM KILL; do
    for ns in $(cat "$dir/namespaces"); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -z $pids ]] || kill -s $round $pids 2>/dev/null || true
    done
    for _ in $(seq 50); do
      pids=""
      for ns in $(cat "$dir/namespaces"); do pids+=$(ip netns pids "$ns" 2>/dev/null || true); done
      [[ -z $pids ]] && break
      sleep 0.05
    done
    [[ -z $pids ]] && break
  done
  for ns in $(cat "$dir/namespaces"); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -f "$dir/namespaces"
}

case ${1:-} in
check)
  why=$(why_not)
  [[ -z $why ]] || { echo "$why"; exit 1; }
  ;;
start) [[ $# -ge 2 ]] || die "usage: $0 start DIR [NODES]"; start "$2" "${3:-3}" ;;
login)
  [[ $# -ge 3 ]] || die "usage: $0 login DIR CMD [ARGS...]"
  dir=$(cd "$2" && pwd)
  shift 2
  in_ns "$dir" login "$@"
  ;;
stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR"; stop "$2" ;;
*) die "usage: $0 check | start DIR [NODES] | login DIR CMD [ARGS...] | stop DIR" ;;
esac
