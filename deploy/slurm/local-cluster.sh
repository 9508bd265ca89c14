#!/usr/bin/env bash
# A one-host Slurm cluster for trying the recipes (and for tests/deploy/test_slurm.py): munged,
# slurmctld and slurmd, as root, with every file under DIR. Debian's slurm-wlm and munge packages.
#
#   deploy/slurm/local-cluster.sh start DIR [GPUS]   # prints the SLURM_CONF to export
#   deploy/slurm/local-cluster.sh stop DIR
#
# The node advertises GPUS "gpu" resources (default 2, at most 4) with no GPU behind them, so
# --gres=gpu:1 and the array's %GPUS throttle behave as on a GPU cluster; jobs run on the CPU.
set -euo pipefail
cmd=${1:?usage: local-cluster.sh start|stop DIR [GPUS]}
dir=$(mkdir -p "${2:?usage: local-cluster.sh start|stop DIR [GPUS]}" && cd "$2" && pwd)
gpus=${3:-2}
[ "$gpus" -ge 1 ] && [ "$gpus" -le 4 ] || { echo "GPUS is 1 to 4 here" >&2; exit 2; }
node=$(hostname -s)

stop() {
    for name in slurmd slurmctld munged; do
        pid=$(cat "$dir/$name.pid" 2>/dev/null) || continue
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        rm -f "$dir/$name.pid"
    done
}

start() {
    mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
    chmod 0700 "$dir/munge"
    [ -f "$dir/munge/munge.key" ] || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 0400 "$dir/munge/munge.key"
    munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
           --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"
    cores=$(nproc)
    cat > "$dir/slurm.conf" <<CONF
ClusterName=jevany-local
SlurmctldHost=$node
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmctldPort=${SLURMCTLD_PORT:-16817}
SlurmdPort=${SLURMD_PORT:-16818}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=300
NodeName=$node CPUs=$cores Gres=gpu:$gpus State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    # Slurm counts a GRES only with a device file behind it: harmless ones stand in for the GPUs.
    stand_ins=(/dev/null /dev/zero /dev/full /dev/urandom)
    : > "$dir/gres.conf"
    for i in $(seq 0 $((gpus - 1))); do echo "Name=gpu File=${stand_ins[$i]}" >> "$dir/gres.conf"; done
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -i
    slurmd -b
    for _ in $(seq 100); do
        if sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            echo "SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    echo "the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
    stop
    return 1
}

case "$cmd" in
    start) stop; start ;;
    stop) stop ;;
    *) echo "usage: local-cluster.sh start|stop DIR [GPUS]" >&2; exit 2 ;;
esac
