#!/usr/bin/env bash
# A one-machine SLURM cluster (munge, slurmctld, slurmd) for running the SLURM profile for real on this machine
# (docs/gpu-nodes.md, "A SLURM cluster on one machine"). Debian's slurm-wlm and munge (`apt-get install slurm-wlm
# munge`); root, since slurmd launches each job as its submitting user.
#
#   scripts/slurm_local.sh start
#   scripts/slurm_local.sh stop
#
# The config goes where every SLURM command looks first, /etc/slurm/slurm.conf (refused if one is there that this
# script did not write): SLURM_CONF is not enough, since the executor plugin's job step (snakemake-executor-plugin-
# slurm-jobstep 0.6.1) drops every SLURM_* variable but the job's identity before its srun. State and logs live in
# $SLURM_LOCAL_DIR (default /tmp/remax-slurm). The node is this machine, with its CPUs and memory as slurmd measures
# them (`slurmd -C`); one partition, "local". Accounting is off, so job status comes from squeue: MinJobAge keeps a
# finished job visible there for 10 minutes, longer than the executor plugin's polling interval.
set -euo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/remax-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by remax-bench scripts/slurm_local.sh"

need() {
  local missing=()
  for tool in munged slurmctld slurmd sbatch squeue scontrol; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  if ((${#missing[@]})); then
    echo "slurm_local.sh: not installed: ${missing[*]} (Debian: apt-get install slurm-wlm munge)" >&2
    exit 2
  fi
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return  # a munged is already serving this machine
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge && dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged
  munge -n </dev/null | unmunge >/dev/null
}

write_conf() {
  local node
  node=$(slurmd -C | head -1)  # NodeName=<host> CPUs=... RealMemory=...
  if [[ -e $CONF ]] && ! grep -qxF "$MARK" "$CONF"; then
    echo "slurm_local.sh: $CONF exists and is not this script's: this machine has a SLURM of its own" >&2
    exit 2
  fi
  mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log" "$(dirname "$CONF")"
  cat >"$CONF.tmp" <<EOF
$MARK
ClusterName=remax-local
SlurmctldHost=$(hostname -s)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# no cgroups in a container: a job's processes are found by their parent chain, and a time limit or scancel
# reaches every one of them (the frameworks' launchers start process groups of their own)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=600
# a job that asks for no memory gets a share, not the whole node
DefMemPerCPU=1024
KillWait=10
$node State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

start() {
  need
  stop_daemons quiet
  start_munge
  write_conf
  slurmctld -c  # a clean controller: no jobs of an earlier cluster come back
  slurmd
  for _ in $(seq 60); do
    if sinfo -h -o %t 2>/dev/null | grep -qx idle; then
      echo "slurm_local.sh: partition local up on $(hostname -s) ($CONF, logs in $DIR/log)" >&2
      return
    fi
    sleep 1
  done
  echo "slurm_local.sh: the node did not become idle in 60 s; see $DIR/log" >&2
  sinfo >&2 || true
  exit 1
}

stop_daemons() {
  for daemon in slurmd slurmctld; do
    local pidfile=$DIR/$daemon.pid pid
    pid=$(cat "$pidfile" 2>/dev/null || true)
    if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
      for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -f "$pidfile"
  done
  [[ ${1:-} == quiet ]] || echo "slurm_local.sh: stopped (state kept in $DIR)" >&2
}

case ${1:-} in
  start) start ;;
  stop) stop_daemons ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
