#!/usr/bin/env bash
# A one-node SLURM cluster on loopback for tests/test_launchers.py: munged, slurmctld and slurmd (Debian's
# 22.05), all state in a temporary folder, this machine's cores and memory as the node. Sourced by .ci/run
# after services.sh; exports SLURM_CONF and ABLATE_TEST_SLURM=1. Where the packages cannot be installed or a
# daemon does not start, it says so and the SLURM tests skip with that reason; CI goes on.

slurm_start() {
  if ! command -v slurmctld >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    # Debian starts a service when its package is installed; these are started here, on our own config.
    local policy=/usr/sbin/policy-rc.d made_policy=
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
    fi
    apt-get update -qq && apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
    local installed=$?
    [ -n "$made_policy" ] && rm -f "$policy"
    [ $installed = 0 ] || { echo "SLURM: packages not installed; its tests skip" >&2; return 1; }
  fi
  slurm_dir=$(mktemp -d /tmp/ablate-slurm.XXXXXX)
  local free_port='import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  # A little under the total: slurmd refuses a node that has less memory than its configuration says.
  local memory_mb=$(( $(awk '/^MemTotal/ {print $2}' /proc/meminfo) * 9 / 10240 ))
  mkdir -p "$slurm_dir/ctld" "$slurm_dir/spool" "$slurm_dir/munge"
  cat > "$slurm_dir/slurm.conf" <<EOF
ClusterName=ablate-test
SlurmctldHost=localhost
SlurmctldPort=$(python3 -c "$free_port")
SlurmdPort=$(python3 -c "$free_port")
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$slurm_dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$slurm_dir/ctld
SlurmdSpoolDir=$slurm_dir/spool
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmdPidFile=$slurm_dir/slurmd.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdLogFile=$slurm_dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobRequeue=1
ReturnToService=2
MpiDefault=none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$slurm_dir/slurm.conf
  dd if=/dev/urandom of="$slurm_dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$slurm_dir/munge/munge.key"
  munged --force --key-file="$slurm_dir/munge/munge.key" --socket="$slurm_dir/munge/munge.socket" \
    --pid-file="$slurm_dir/munge/munged.pid" --log-file="$slurm_dir/munge/munged.log" \
    --seed-file="$slurm_dir/munge/munged.seed" || return 1
  slurmctld -i || return 1  # -i: no state to recover from a previous cluster
  slurmd -N localhost || return 1
  local tries
  for tries in $(seq 60); do
    sinfo -h -N -o %t 2>/dev/null | grep -qx idle && break
    sleep 1
  done
  sinfo -h -N -o %t 2>/dev/null | grep -qx idle || { echo "SLURM: the node never became idle" >&2; return 1; }
  export ABLATE_TEST_SLURM=1
  echo "SLURM: one node, $(nproc) CPUs, $memory_mb MB ($slurm_dir)"
}

# Cancels what is left in the queue, waits until it is empty, then stops the daemons started above.
slurm_stop() {
  [ -n "${slurm_dir:-}" ] || return 0
  local tries
  if [ -n "${ABLATE_TEST_SLURM:-}" ]; then
    scancel --full --quiet --user="$(id -un)" 2>/dev/null
    for tries in $(seq 60); do
      [ -z "$(squeue -h 2>/dev/null)" ] && break
      sleep 1
    done
  fi
  local pidfile pid
  for pidfile in slurmd.pid slurmctld.pid munge/munged.pid; do
    [ -f "$slurm_dir/$pidfile" ] || continue
    pid=$(cat "$slurm_dir/$pidfile")
    kill "$pid" 2>/dev/null
    for tries in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  done
  rm -rf "$slurm_dir"
}

if ! slurm_start; then
  echo "SLURM: not started; tests/test_launchers.py skips its SLURM tests" >&2
  slurm_stop
  unset ABLATE_TEST_SLURM
fi
# Run before whatever EXIT trap a script sourced earlier set (services.sh stops PostgreSQL there); the
# positional parameters lend the parsing and are given back to the script that sourced this one.
slurm_args=("$@")
eval "set -- $(trap -p EXIT)"
trap "slurm_stop${3:+; $3}" EXIT
set -- "${slurm_args[@]}"
unset slurm_args
