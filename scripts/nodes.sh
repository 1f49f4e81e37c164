#!/usr/bin/env bash
# Several "machines" on this one, for multi-node runs.
# Each node is a Linux network namespace with its own network stack, its own
# hostname, its own /dev/shm and its own local disk; the nodes are joined by
# virtual ethernet links through a bridge, each link optionally capped by a
# token bucket (`tc ... tbf`). Open MPI then starts ranks on them as it would
# on separate machines, and the ranks talk over TCP between nodes.
#
#   scripts/nodes.sh up [--nodes 2] [--slots 2] [--rate 1gbit|10gbit|none]
#   scripts/launch.sh -np 4 --hostfile /run/ddpwb/main/hosts \
#       target/release/examples/train --backend mpi
#   scripts/nodes.sh down
#
# Commands (each takes --name NAME, default `main`, or $DDPWB_CLUSTER):
#   up       make the nodes (a leftover cluster of the same name is removed
#            first) and write the host file /run/ddpwb/NAME/hosts
#   down     kill every process on the nodes and remove them (idempotent)
#   status   the nodes, their addresses, links, caps and processes
#   rate R   cap every link at R each way (tc's units: 1gbit, 500mbit), or none
#   link NODE up|down
#            plug or unplug a node's cable (the bridge's end of its link)
#   exec NODE CMD...   run CMD on a node (node1, node2, ...)
#   pids NODE          the processes on a node, "PID COMMAND" per line
#   agent HOST CMD...  Open MPI's plm_rsh_agent (what ssh is on a cluster):
#            run CMD on HOST; scripts/launch.sh sets it up, not you
#   sweep --job ID     wait up to 10 s for the processes of launch.sh's job ID
#            to end on every node, then kill those left, naming them
#   check    can nodes be made here? exit 0, or 1 and the reason
#
# Layout: namespaces ddpwb-NAME-node1..N and ddpwb-NAME-hub; the hub holds
# the bridge (10.77.0.254, where launch.sh runs mpirun) and node K is
# 10.77.0.K/24. Nothing is added to this machine's own network: no address
# outside those namespaces, no route, no interface. Each node sees its own
# folder /run/ddpwb/NAME/disks/nodeK at /run/ddpwb/NAME/local (a disk no
# other node can read), and TCP gives up on a silent peer after about 3 s
# (net.ipv4.tcp_retries2 = 3 in each namespace; Linux's default, 15, waits
# about 15 minutes), so a node that drops off cannot keep a job alive.
# Needs root, ip and tc (iproute2), unshare and mount (util-linux).

set -Eeuo pipefail # -E: the ERR trap of `up` also fires inside the functions it calls

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
SUBNET=10.77.0
NAME="${DDPWB_CLUSTER:-main}"

die() {
    echo "scripts/nodes.sh: $*" >&2
    exit 1
}

# What stops nodes from being made here, in words; nothing when they can be.
missing() {
    [[ "$(id -u)" == 0 ]] || {
        echo "needs root (it creates network namespaces); run it as root (sudo)"
        return
    }
    local tool
    for tool in ip tc unshare mount; do
        command -v "$tool" >/dev/null 2>&1 ||
            { echo "needs \`$tool\` (apt-get install iproute2 util-linux)"; return; }
    done
    local probe="ddpwb-probe-$$" error
    if ! error=$(ip netns add "$probe" 2>&1); then
        echo "cannot create a network namespace here ($error); containers need --privileged or CAP_SYS_ADMIN"
        return
    fi
    if ! error=$(ip -n "$probe" link add probe0 type veth peer name probe1 2>&1 &&
        ip -n "$probe" link add probebr type bridge 2>&1); then
        echo "cannot create virtual ethernet links or bridges ($error): the kernel lacks veth or bridge"
    fi
    ip netns del "$probe" 2>/dev/null || true
}

namespaces() { ip netns list | awk '{print $1}' | grep -E "^ddpwb-$NAME-(hub|node[0-9]+)\$" || true; }
state() { echo "/run/ddpwb/$NAME"; }
node_number() { # node2, 10.77.0.2 or 2 -> 2
    local k="${1#node}"
    k="${k#"$SUBNET."}"
    [[ "$k" =~ ^[0-9]+$ && -e "/run/netns/ddpwb-$NAME-node$k" ]] ||
        die "no node \`$1\` in cluster $NAME (scripts/nodes.sh status lists them)"
    echo "$k"
}

# tbf lets a full bucket through at the speed of the machine, then holds
# the rate. A large bucket would let a whole gradient message pass unshaped;
# a small one cannot reach the rate (the kernel's timers): 0.2 ms of bytes,
# at least 64 KiB (one TCP segment as the kernel hands it down).
burst_for() {
    local rate="$1" number unit
    [[ "$rate" =~ ^([0-9]+(\.[0-9]+)?)([kmg]?)bit$ ]] ||
        die "--rate $rate: give it as tc does, such as 1gbit, 500mbit or 10gbit (or none)"
    number="${BASH_REMATCH[1]}" unit="${BASH_REMATCH[3]}"
    awk -v n="$number" -v u="$unit" 'BEGIN {
        m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : 1
        b = n * m / 8 * 0.0002; if (b < 65536) b = 65536; printf "%d", b }'
}

set_rate() {
    local rate="$1" ns dev
    for ns in $(namespaces); do
        [[ "$ns" == *-hub ]] && continue
        local k="${ns##*-node}"
        for end in "ddpwb-$NAME-node$k eth0" "ddpwb-$NAME-hub n$k"; do
            read -r ns dev <<<"$end"
            if [[ "$rate" == none ]]; then
                ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
            else
                ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" \
                    burst "$(burst_for "$rate")" latency 20ms
            fi
        done
    done
    [[ -d "$(state)" ]] && echo "$rate" >"$(state)/rate"
    return 0
}

# A namespace's network settings: TCP gives up on a silent peer after about
# 3 s (0.2 + 0.4 + 0.8 + 1.6 s of retransmissions), and no IPv6 (the nodes
# talk on their IPv4 subnet only).
tune() {
    ip netns exec "$1" sysctl -q -w net.ipv4.tcp_retries2=3 net.ipv6.conf.all.disable_ipv6=1 \
        net.ipv6.conf.default.disable_ipv6=1
}

down() {
    local ns pid
    for ns in $(namespaces); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    done
    for ns in $(namespaces); do
        for _ in 1 2 3 4 5 6 7 8 9 10; do [[ -z "$(ip netns pids "$ns" 2>/dev/null)" ]] && break; sleep 0.1; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$(state)"
}

up() {
    local nodes=2 slots=2 rate=none
    while (($#)); do
        case "$1" in
            --nodes) nodes="$2"; shift 2 ;;
            --slots) slots="$2"; shift 2 ;;
            --rate) rate="$2"; shift 2 ;;
            --name) NAME="$2"; shift 2 ;;
            *) die "up: unknown argument \`$1\` (see the top of scripts/nodes.sh)" ;;
        esac
    done
    [[ "$nodes" =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 200)) || die "--nodes must be 1 to 200, got $nodes"
    [[ "$slots" =~ ^[0-9]+$ ]] && ((slots >= 1)) || die "--slots must be at least 1, got $slots"
    [[ "$rate" == none ]] || burst_for "$rate" >/dev/null
    local why
    why="$(missing)"
    [[ -z "$why" ]] || die "cannot make nodes here: $why"
    down # a leftover of a killed run must not get in the way
    trap 'echo "scripts/nodes.sh: up failed; removing what it made" >&2; down' ERR
    local hub="ddpwb-$NAME-hub" dir
    dir="$(state)"
    ip netns add "$hub"
    ip -n "$hub" link set lo up
    ip -n "$hub" link add br0 type bridge
    ip -n "$hub" addr add "$SUBNET.254/24" dev br0
    ip -n "$hub" link set br0 up
    tune "$hub"
    mkdir -p "$dir/local"
    {
        echo "# ddpwb cluster $NAME: made by scripts/nodes.sh up; start a job on it with"
        echo "# scripts/launch.sh -np N --hostfile $dir/hosts PROGRAM (see scripts/launch.sh)"
    } >"$dir/hosts"
    local k node
    for ((k = 1; k <= nodes; k++)); do
        node="ddpwb-$NAME-node$k"
        ip netns add "$node"
        # Both ends are made inside their namespaces: nothing appears here.
        ip -n "$hub" link add "n$k" type veth peer name eth0 netns "$node"
        ip -n "$hub" link set "n$k" master br0 up
        ip -n "$node" addr add "$SUBNET.$k/24" dev eth0
        ip -n "$node" link set eth0 up
        ip -n "$node" link set lo up
        tune "$node"
        mkdir -p "$dir/disks/node$k"
        echo "$SUBNET.$k slots=$slots" >>"$dir/hosts"
    done
    set_rate "$rate"
    trap - ERR
    local cap="capped at $rate each way"
    [[ "$rate" == none ]] && cap="not capped (tc: scripts/nodes.sh rate 1gbit)"
    echo "cluster $NAME: $nodes node(s) of $slots slot(s), links $cap"
    for ((k = 1; k <= nodes; k++)); do
        echo "  node$k  $SUBNET.$k  (namespace ddpwb-$NAME-node$k, local disk $dir/local)"
    done
    echo "  mpirun  $SUBNET.254  (namespace $hub)"
    echo "host file: $dir/hosts"
    echo "run:  scripts/launch.sh -np $((nodes * slots)) --hostfile $dir/hosts PROGRAM ARGS"
    echo "stop: scripts/nodes.sh down${NAME:+ --name $NAME}"
}

# ANCHOR: on_node
# Runs "$@" on node K, as a process of that machine: its network, its
# hostname (Open MPI names shared-memory files by hostname), its own
# /dev/shm, and its own disk at $(state)/local. `ip netns exec` gives the
# command a mount namespace of its own, so these mounts stay inside it.
on_node() {
    local k="$1"
    shift
    local dir
    dir="$(state)"
    exec ip netns exec "ddpwb-$NAME-node$k" unshare --uts -- sh -c '
        echo "$1" >/proc/sys/kernel/hostname && mount -t tmpfs -o mode=1777 ddpwb-shm /dev/shm &&
        mount --bind "$2" "$3" || exit 1
        shift 3
        exec "$@"' on_node "ddpwb-$NAME-node$k" "$dir/disks/node$k" "$dir/local" "$@"
}
# ANCHOR_END: on_node

sweep() {
    local job="" ns pid left
    [[ "${1:-}" == --job && -n "${2:-}" ]] && job="$2" || die "sweep needs --job ID"
    job_pids() {
        for ns in $(namespaces); do
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "DDPWB_JOB=$job" &&
                    echo "$pid:${ns##*-}:$(cat "/proc/$pid/comm" 2>/dev/null)"
            done
        done
        return 0
    }
    for _ in $(seq 1 100); do
        left="$(job_pids)"
        [[ -z "$left" ]] && return 0
        sleep 0.1
    done
    echo "scripts/nodes.sh: processes of the job still ran 10 s after mpirun ended; killing them:" \
        "$(echo "$left" | awk -F: '{printf "%s%s (pid %s) on %s", sep, $3, $1, $2; sep = ", "}')" >&2
    for pid in $(echo "$left" | cut -d: -f1); do kill -9 "$pid" 2>/dev/null || true; done
}

status() {
    local ns
    [[ -n "$(namespaces)" ]] || { echo "cluster $NAME: no nodes (scripts/nodes.sh up makes them)"; return; }
    echo "cluster $NAME: host file $(state)/hosts, links capped at $(cat "$(state)/rate" 2>/dev/null)"
    for ns in $(namespaces); do
        [[ "$ns" == *-hub ]] && continue
        local k="${ns##*-node}" cable
        cable="$(ip -n "ddpwb-$NAME-hub" -br link show "n$k" | awk '{print $2}')"
        echo "  node$k  $SUBNET.$k  cable $cable  processes: $(ip netns pids "$ns" | wc -l)"
    done
}

command="${1:-}"
shift || true
while [[ "${1:-}" == --name ]]; do
    NAME="${2:?--name needs a value}"
    shift 2
done
[[ "$NAME" =~ ^[a-z0-9]{1,12}$ ]] || die "--name must be 1 to 12 lowercase letters or digits, got \`$NAME\`"
case "$command" in
    up) up "$@" ;;
    down) down ;;
    status) status ;;
    check)
        why="$(missing)"
        [[ -z "$why" ]] || { echo "cannot make nodes here: $why"; exit 1; }
        echo "nodes can be made here (root, ip, tc, network namespaces, veth, bridge)"
        ;;
    rate) [[ -n "$(namespaces)" ]] || die "no cluster $NAME: run scripts/nodes.sh up first"; set_rate "${1:?rate needs a value, such as 1gbit or none}" ;;
    link)
        k="$(node_number "${1:?link needs a node}")"
        [[ "${2:-}" == up || "${2:-}" == down ]] || die "link $1 needs up or down"
        ip -n "ddpwb-$NAME-hub" link set "n$k" "$2"
        ;;
    exec) k="$(node_number "${1:?exec needs a node}")"; shift; on_node "$k" "$@" ;;
    pids)
        k="$(node_number "${1:?pids needs a node}")"
        for pid in $(ip netns pids "ddpwb-$NAME-node$k"); do echo "$pid $(cat "/proc/$pid/comm" 2>/dev/null)"; done
        ;;
    agent)
        # Called by mpirun inside the hub: the cluster is the hub's.
        hub="$(ip netns identify $$)"
        [[ "$hub" =~ ^ddpwb-([a-z0-9]+)-hub$ ]] || die "agent: run by mpirun in a cluster's hub, not in \`$hub\`"
        NAME="${BASH_REMATCH[1]}"
        k="$(node_number "${1:?agent needs a host}")"
        shift
        # ssh would fail to connect to a node whose cable is out; so does this.
        if [[ "$(ip -n "$hub" -br link show "n$k" | awk '{print $2}')" != UP ]]; then
            echo "scripts/nodes.sh agent: cannot reach $SUBNET.$k: node$k's cable is unplugged" >&2
            exit 255
        fi
        # Like ssh, it hands the remote shell one command line.
        on_node "$k" sh -c "$*"
        ;;
    sweep) sweep "$@" ;;
    *) die "unknown command \`$command\`: up, down, status, rate, link, exec, pids, agent, sweep or check (see the top of $SCRIPT)" ;;
esac
