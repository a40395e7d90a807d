#!/bin/bash
# A SLURM cluster on this one machine, one slurmd per emulated host, to run
# scripts/slurm_train.sbatch for real:
#
#   scripts/slurm_local.sh up [--hosts 2] [--rate 1gbit] [--name slurm] [--cpus C] [--port 6817] [--private]
#   sbatch scripts/slurm_train.sbatch trainer.epochs=1      # from a shell that has torchrun on PATH
#   scripts/slurm_local.sh status [--name slurm]
#   scripts/slurm_local.sh install                     # only the packages (up does it too)
#   scripts/slurm_local.sh down [--name slurm]
#
# What `up` makes (as root), and `down` removes again:
#
# * Debian's slurmd, slurmctld, slurm-client and munge (slurm-wlm 22.05),
#   installed with apt-get when missing (they stay installed after `down`).
# * An emulated cluster (python -m ddp_lab.tools.cluster up --name NAME): hosts
#   NAME-0 .. NAME-(N-1), each a network namespace with its own address,
#   hostname and /etc/hosts, links shaped to RATE. They are the SLURM nodes.
# * A link, sl-NAME, from this machine's own network namespace into the
#   cluster's switch, at address .254 of the hosts' subnet: this namespace is
#   the cluster's login node and controller, so sbatch, squeue, scontrol,
#   scancel and srun work from any shell here, and slurmctld reaches every slurmd.
# * STATE=/run/ddp_lab-slurm/NAME: slurm.conf, a munge key of its own, the
#   daemons' sockets, pid files, logs, spool and state.
# * /etc/slurm/slurm.conf, a symbolic link to STATE/slurm.conf, so that plain
#   sbatch finds the cluster; only when no slurm.conf is there yet, and not
#   with --private (then: export SLURM_CONF=STATE/slurm.conf; jobs inherit it).
# * munged (as user munge) and slurmctld (on --port) here, and one slurmd per
#   host inside the host: its network namespace, hostname and hosts file. So
#   a job sees the node it runs on, and srun and torchrun's rendezvous cross
#   the shaped links.
#
# Why slurmd is not started with `ip netns exec`: that remounts /sys for the
# namespace, which hides the cgroup filesystems under /sys/fs/cgroup, and
# slurmd 22.05 loads a cgroup plugin even when no cgroup plugin is configured:
# it exits with "No filesystem mounted on /sys/fs/cgroup ... slurmd
# initialization failed". So each slurmd enters only its host's network
# namespace (nsenter --net), in a mount namespace of its own where the host's
# /etc/netns/<namespace>/{hosts,hostname} are bind-mounted over /etc's, as
# `ip netns exec` does, and a UTS namespace with the host's hostname.
#
# No cgroup plugins (proctrack/linuxproc: a job's processes are the
# descendants of its slurmstepd; task/none). They do run here (cgroup v1;
# Debian builds slurmd with MULTIPLE_SLURMD, so each node gets its own
# slurm_<node>/ tree), but every emulated node numbers its CPUs from 0:
# with ConstrainCores the jobs of slurm-0 and slurm-1 were both pinned to
# CPU 0 while CPU 1 stayed idle. And the slurm_<node>/ cgroups outlive the
# daemons. So SLURM schedules, launches, signals and requeues here, but does
# not confine a job's cores or memory. Each node offers CPUs = the machine's
# cores // hosts (at least 1; or --cpus), its share of the cores all hosts use.
#
# A requeued job (scontrol requeue) may start again only once its launch
# credential has expired (AuthInfo cred_expire: 120 s by default, 10 s
# here), and then waits for the main scheduler's next pass (sched_interval:
# 60 s by default, 2 s here): measured, 121 s from requeue to restart with
# the defaults, 13 s with these.
#
# The controller's job ids start from the clock (seconds, modulo 6e7): a fresh
# slurmctld would count from 1 again, and a new job would find an earlier
# cluster's run directory outputs/<job id>/ and, with trainer.resume=auto,
# continue that run.
#
# Every failure is one line on stderr saying what is missing and how to fix
# it, exit status 2; an `up` that fails removes what it had made and keeps the
# daemons' logs in /tmp/ddp_lab-slurm-NAME-failed-up/.
set -u

ME=$(basename "$0")
REPO=$(cd "$(dirname "$0")/.." && pwd)
ROOT=/run/ddp_lab-slurm
PEER=vctl                  # the controller's port on the switch's bridge
SLURMD_PORT=6818           # every slurmd in its own namespace: all may use the same port
ETC_CONF=/etc/slurm/slurm.conf
PACKAGES=(slurmd slurmctld slurm-client munge)
NAME=slurm

set_name() {  # the names that follow from the cluster's name
    NAME=$1
    [[ $NAME =~ ^[a-z][a-z0-9]{0,11}$ ]] ||
        die "--name $NAME: use 1-12 lower-case letters and digits, starting with a letter (e.g. --name slurm)"
    STATE=$ROOT/$NAME
    LINK=sl-$NAME
    FAILED_LOGS=/tmp/ddp_lab-slurm-$NAME-failed-up
}

die() { echo "$ME: error: $*" >&2; exit 2; }
say() { echo "$ME: $*"; }

python_with_ddp_lab() {
    local py
    for py in "${PYTHON:-}" "$REPO/.venv/bin/python" python3; do
        if [ -n "$py" ] && "$py" -c "import ddp_lab.tools.cluster" 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    return 1
}

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { [ -f "$1" ] && cat "$1" 2>/dev/null; }

wait_for() {  # $1 seconds, $2.. a command that succeeds once ready
    local deadline=$(( SECONDS + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -ge $deadline ] && return 1
        sleep 0.2
    done
}

usage() {
    die "usage: $ME install | up [--hosts N] [--rate RATE] [--name NAME] [--cpus C] [--port P] [--private] | status [--name NAME] | down [--name NAME]"
}

require_root() {
    [ "$(id -u)" = 0 ] ||
        die "SLURM's daemons, network namespaces and apt-get need root: run as root (sudo $0 $1 ...)"
}

# ------------------------------------------------------------------- install
install_packages() {
    local missing=() p log
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return 0
    command -v apt-get >/dev/null ||
        die "${missing[*]} not installed and no apt-get here: install Debian's ${missing[*]} (slurm-wlm 22.05) by hand"
    say "installing ${missing[*]} (apt-get)"
    log=$(mktemp /tmp/ddp_lab-slurm-apt.XXXXXX)
    # the packages' own services stay as the system has them; the daemons here are ours
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
              --no-install-recommends "${missing[@]}"; } > "$log" 2>&1; then
        die "apt-get install ${missing[*]} failed ($(grep -m1 -E '^(E|W|Err):' "$log" || tail -n1 "$log")): is Debian's package registry reachable? Full output: $log"
    fi
    rm -f "$log"
}

require_tools() {
    local t
    for t in ip ss nsenter unshare runuser mungekey munged slurmctld slurmd sinfo; do
        command -v "$t" >/dev/null ||
            die "$t not found: apt-get install iproute2 util-linux munge slurmd slurmctld slurm-client"
    done
    grep -q ' /sys/fs/cgroup[ /]' /proc/mounts ||
        die "no cgroup filesystem under /sys/fs/cgroup, and slurmd 22.05 will not start without one: mount it there (a container: start it with the host's /sys/fs/cgroup mounted)"
}

# ------------------------------------------------------------------- up
write_conf() {  # $1 controller address, $2 host addresses (space separated), $3 CPUs per node, $4 port
    local i=0 a
    {
        echo "# Written by scripts/slurm_local.sh up; removed by down."
        echo "ClusterName=$NAME"
        echo "SlurmctldHost=$(hostname -s)($1)"
        echo "SlurmctldPort=$4"
        echo "SlurmdPort=$SLURMD_PORT"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        # cred_expire: a requeued job waits this long before it may start again (default 120 s)
        echo "AuthInfo=socket=$STATE/munge/munge.socket.2,cred_expire=10"
        echo "StateSaveLocation=$STATE/ctld"
        echo "SlurmctldPidFile=$STATE/slurmctld.pid"
        echo "SlurmctldLogFile=$STATE/log/slurmctld.log"
        echo "SlurmdSpoolDir=$STATE/spool/%n"
        echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
        echo "SlurmdLogFile=$STATE/log/slurmd-%n.log"
        echo "FirstJobId=$(( $(date +%s) % 60000000 + 1 ))"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        # the main scheduler looks at pending jobs every 60 s by default, e.g. at a
        # requeued job whose wait is over: here it need not wait that long
        echo "SchedulerParameters=sched_interval=2"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SlurmdParameters=config_overrides"  # CPUs as written here, not as counted
        echo "MpiDefault=none"
        echo "ReturnToService=2"
        echo "MailProg=/bin/true"
        for a in $2; do
            echo "NodeName=$NAME-$i NodeAddr=$a NodeHostname=$NAME-$i CPUs=$3 State=UNKNOWN"
            i=$((i + 1))
        done
        echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } > "$STATE/slurm.conf"
}

all_nodes_idle() {
    local states
    states=$(sinfo -h -N -o '%T' 2>/dev/null) || return 1
    [ -n "$states" ] && [ -z "$(grep -v -x idle <<< "$states")" ]
}

failed_up() {  # keep the logs that say why, remove the rest
    rm -rf "$FAILED_LOGS" && mkdir -p "$FAILED_LOGS"
    cp -r "$STATE/log/." "$STATE/slurm.conf" "$FAILED_LOGS/" 2>/dev/null
    cp "$STATE/munge/munged.log" "$FAILED_LOGS/" 2>/dev/null
    echo "$ME: up failed: removing what it made (its logs: $FAILED_LOGS)" >&2
    down >/dev/null 2>&1
}

start_slurmd() {  # $1 host index: slurmd inside the host (see the top: why not ip netns exec)
    local node=$NAME-$1 netns=ddplab-$NAME-$1
    mkdir -p "$STATE/spool/$node"
    nsenter --net="/run/netns/$netns" unshare --mount --uts -- sh -c '
        for f in hosts hostname; do mount --bind "/etc/netns/$3/$f" "/etc/$f" || exit 1; done
        hostname "$1" && exec slurmd -f "$2" -N "$1"' sh "$node" "$SLURM_CONF" "$netns" \
        2> "$STATE/log/slurmd-$node.start" ||
        die "slurmd on $node did not start: $(cat "$STATE/log/slurmd-$node.log" \
            "$STATE/log/slurmd-$node.start" 2>/dev/null | grep -v '^ *$' | tail -n1)"
}

up() {
    local hosts=2 rate=1gbit cpus="" port=6817 private=0
    while [ $# -gt 0 ]; do
        case $1 in
            --hosts) hosts=${2:-}; shift 2 || usage ;;
            --rate) rate=${2:-}; shift 2 || usage ;;
            --name) set_name "${2:-}"; shift 2 || usage ;;
            --cpus) cpus=${2:-}; shift 2 || usage ;;
            --port) port=${2:-}; shift 2 || usage ;;
            --private) private=1; shift ;;
            *) usage ;;
        esac
    done
    [[ $hosts =~ ^[1-9][0-9]*$ ]] || die "--hosts $hosts: give a number of hosts, e.g. --hosts 2"
    [[ -z $cpus || $cpus =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus: give a number of CPUs per node, e.g. --cpus 1"
    [[ $port =~ ^[1-9][0-9]*$ ]] && [ "$port" -lt 65536 ] || die "--port $port: give a TCP port, e.g. --port 6817"
    require_root up
    if [ -e "$STATE" ]; then
        if [ -f "$STATE/up" ]; then
            say "cluster $NAME is up already; to change it: $0 down --name $NAME, then up"
            exit 0
        fi
        die "$STATE exists from an up that did not finish: run $0 down --name $NAME, then up again"
    fi
    local py
    py=$(python_with_ddp_lab) ||
        die "no Python that imports ddp_lab: run make test once (it makes .venv), or set PYTHON=<python with ddp_lab installed>"
    install_packages
    require_tools
    ! ss -Hltn "sport = :$port" | grep -q . ||
        die "port $port (for slurmctld) is taken on this machine: choose another with --port, or stop what listens there (ss -ltnp 'sport = :$port')"
    ! ip link show "$LINK" >/dev/null 2>&1 ||
        die "a link named $LINK exists already: run $0 down --name $NAME, or ip link del $LINK"
    "$py" -c "import sys; from ddp_lab.tools.cluster import find; sys.exit(find(sys.argv[1]) is not None)" "$NAME" ||
        die "an emulated cluster named $NAME exists and is not this script's: choose another --name"

    mkdir -p -m 0755 "$ROOT" && mkdir -m 0755 "$STATE" || die "cannot make $STATE: is /run writable?"
    trap failed_up EXIT
    echo "$NAME" > "$STATE/cluster"  # down removes the emulated cluster named here
    local out
    out=$("$py" -m ddp_lab.tools.cluster up --hosts "$hosts" --rate "$rate" --name "$NAME" 2>&1) ||
        die "$(tail -n1 <<< "$out")"

    # This namespace joins the switch as the controller, at .254 of the hosts' /24.
    local addresses="" i a ctl
    for ((i = 0; i < hosts; i++)); do
        a=$(ip -n "ddplab-$NAME-$i" -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1)
        [ -n "$a" ] || die "host $NAME-$i has no address: see python -m ddp_lab.tools.cluster status"
        addresses+="$a "
    done
    ctl="$(cut -d. -f1-3 <<< "${addresses%% *}").254"
    { ip link add "$LINK" type veth peer name "$PEER" netns "ddplab-$NAME-sw" &&
        ip -n "ddplab-$NAME-sw" link set "$PEER" master br0 up &&
        ip addr add "$ctl/24" dev "$LINK" && ip link set "$LINK" up; } ||
        die "could not link this namespace into cluster $NAME's switch (ip link add $LINK type veth ...): is CAP_NET_ADMIN available?"

    [ -n "$cpus" ] || cpus=$(( $(nproc) / hosts > 0 ? $(nproc) / hosts : 1 ))
    mkdir -p "$STATE/ctld" "$STATE/log" "$STATE/spool"
    write_conf "$ctl" "$addresses" "$cpus" "$port"

    # munge: a key of its own, its socket under STATE, run as user munge.
    install -d -o munge -g munge -m 0755 "$STATE/munge"
    runuser -u munge -- mungekey --create --keyfile="$STATE/munge/munge.key" ||
        die "mungekey could not make a key in $STATE/munge: reinstall munge (apt-get install --reinstall munge)"
    runuser -u munge -- munged --socket="$STATE/munge/munge.socket.2" --key-file="$STATE/munge/munge.key" \
        --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
        --seed-file="$STATE/munge/munged.seed" ||
        die "munged did not start: $(tail -n1 "$STATE/munge/munged.log" 2>/dev/null)"

    if [ $private = 0 ] && [ ! -e "$ETC_CONF" ] && [ ! -L "$ETC_CONF" ]; then
        mkdir -p "$(dirname "$ETC_CONF")" && ln -s "$STATE/slurm.conf" "$ETC_CONF"
    fi
    export SLURM_CONF=$STATE/slurm.conf
    slurmctld -f "$SLURM_CONF" 2> "$STATE/log/slurmctld.start" ||
        die "slurmctld did not start: $(cat "$STATE/log/slurmctld.log" "$STATE/log/slurmctld.start" \
            2>/dev/null | grep -v '^ *$' | tail -n1)"
    wait_for 20 scontrol ping ||
        die "slurmctld does not answer (scontrol ping): see $STATE/log/slurmctld.log"
    for ((i = 0; i < hosts; i++)); do
        start_slurmd "$i"
    done
    wait_for 30 all_nodes_idle ||
        die "the nodes did not come up idle within 30 s ($(sinfo -h -N -o '%N %T %E' | tr '\n' ';')): see $STATE/log/"
    trap - EXIT
    touch "$STATE/up"
    status
    if [ "$(readlink "$ETC_CONF")" != "$STATE/slurm.conf" ]; then
        say "for sbatch, squeue, scontrol: export SLURM_CONF=$STATE/slurm.conf"
    fi
}

# ------------------------------------------------------------------- down
stop_daemons() {  # $@ pid files: SIGTERM to all, then SIGKILL to what is left after 10 s
    local f pid pids=() names=()
    for f in "$@"; do
        pid=$(pid_of "$f") && pid_alive "$pid" || continue
        kill -TERM "$pid" 2>/dev/null && pids+=("$pid") && names+=("$(basename "$f" .pid) ($pid)")
    done
    [ ${#pids[@]} = 0 ] && return 0
    wait_for 10 bash -c "! ps -p '${pids[*]}' >/dev/null" ||  # ps fails once none is left
        kill -KILL "${pids[@]}" 2>/dev/null
    echo "stopped ${names[*]}"
}

down() {
    require_root down
    if [ ! -e "$STATE" ] && ! ip link show "$LINK" >/dev/null 2>&1; then
        say "no cluster $NAME ($STATE does not exist)"; return 0
    fi
    export SLURM_CONF=$STATE/slurm.conf
    local jobs
    if pid_alive "$(pid_of "$STATE/slurmctld.pid")"; then
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            scancel $jobs 2>/dev/null && echo "cancelled jobs $jobs"
            wait_for 30 bash -c '[ -z "$(squeue -h -o %i 2>/dev/null)" ]'
        fi
    fi
    stop_daemons "$STATE"/slurmd-*.pid "$STATE/slurmctld.pid" "$STATE/munge/munged.pid"
    if ip link show "$LINK" >/dev/null 2>&1; then
        ip link del "$LINK" && echo "removed link $LINK"
    fi
    if [ -f "$STATE/cluster" ]; then
        # this also stops what a job left running inside the hosts (slurmstepd, its processes)
        local py
        py=$(python_with_ddp_lab) ||
            die "no Python that imports ddp_lab to remove cluster $NAME: set PYTHON=<python with ddp_lab installed>, then $0 down --name $NAME again"
        "$py" -m ddp_lab.tools.cluster down --name "$(cat "$STATE/cluster")" || exit 2
    fi
    if [ -L "$ETC_CONF" ] && [ "$(readlink "$ETC_CONF")" = "$STATE/slurm.conf" ]; then
        rm -f "$ETC_CONF" && echo "removed $ETC_CONF (a link to $STATE/slurm.conf)"
    fi
    rm -rf "$STATE" && echo "removed $STATE"
    rmdir "$ROOT" 2>/dev/null
    return 0
}

# ------------------------------------------------------------------- status
status() {  # exit status 0: up and every daemon runs; 3: not up or a daemon is missing
    if [ ! -f "$STATE/up" ]; then
        say "cluster $NAME is not up (no $STATE/up)"; return 3
    fi
    export SLURM_CONF=$STATE/slurm.conf
    local f pid rc=0
    echo "cluster $NAME: SLURM_CONF=$SLURM_CONF"
    for f in "$STATE/munge/munged.pid" "$STATE/slurmctld.pid" "$STATE"/slurmd-*.pid; do
        pid=$(pid_of "$f")
        if pid_alive "$pid"; then echo "  $(basename "$f" .pid): running ($pid)"
        else echo "  $(basename "$f" .pid): NOT running"; rc=3; fi
    done
    sinfo -N -o '%N %T %c %E' 2>&1 | sed 's/^/  /'
    squeue 2>&1 | sed 's/^/  /'
    return $rc
}

action=${1:-}
[ $# -gt 0 ] && shift
set_name slurm
case $action in
    up) up "$@" ;;
    install) [ $# = 0 ] || usage; require_root install; install_packages; require_tools ;;
    down|status)
        case "${1:-}" in
            "") ;;
            --name) [ $# = 2 ] || usage; set_name "$2" ;;
            *) usage ;;
        esac
        $action ;;
    *) usage ;;
esac
