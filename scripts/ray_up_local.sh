#!/usr/bin/env bash
# Bring cluster.yaml's local variant (scripts/cluster_local.yaml) up for real with `ray up` on this
# one machine, check it, and take it down:
#   - everything runs inside a private PID + mount + network namespace (root needed), so `ray up`,
#     `ray down` and their `ray stop` see and touch no other Ray on the machine, and whatever
#     is left dies with the namespace;
#   - sshd on loopback (port 22 of the private network), a generated host key and client key, and
#     a scratch HOME and /tmp bind-mounted over /root and /tmp (`ray up` writes its bootstrap
#     config, key and token there);
#   - a head at 127.0.0.2 and a worker at 127.0.0.3, token authentication on;
#   - checks: both nodes up, a job that runs brokers on both nodes and moves 100 messages between
#     them, a broker's direct channel port closing connections without a valid ticket, drivers
#     without the token (or with a wrong one) and the job API without it refused,
#     `ray down` leaves no Ray process. With --demo, `raybroker demo --orders N --steady-s 5` runs as a job too
#     (Spark on the cluster: Java 17 needed, ~2 more minutes).
# Prints PASS/FAIL per check and a RESULT line; exits 0 only when every check passed.
#
# Usage: scripts/ray_up_local.sh [--demo] [--orders N] [--ssh] [--keep]
#   --demo   also run `raybroker demo --orders N --steady-s 5` (default 200) as a job
#   --ssh    run the jobs with `ray exec` over SSH on the head, not through the job API (what
#            happens anyway when the virtualenv lacks ray[default], which the dashboard needs)
#   --keep   keep the scratch directory (logs, config, session logs) even when everything passed
# Needs: root, util-linux (unshare), iproute2, openssh-server, openssh-client, rsync, and this
# checkout's virtualenv (.venv, with ray[default]==2.60.0 and the project installed).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
HEAD_IP=127.0.0.2
WORKER_IP=127.0.0.3
DEADLINE_S=120 # for each wait: sshd, worker join

# ------------------------------------------------------------------------------------------------
# Outside: check what is needed, make a scratch directory, re-run this script in a namespace.
# ------------------------------------------------------------------------------------------------
if [[ "${1:-}" != "--inside" ]]; then
    keep=0
    for arg in "$@"; do [[ "$arg" == "--keep" ]] && keep=1; done
    missing=()
    [[ "$(id -u)" == 0 ]] || missing+=("root (unshare needs it)")
    for tool in unshare ip ssh ssh-keygen rsync /usr/sbin/sshd; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [[ "$(id -u)" == 0 ]] && command -v unshare >/dev/null &&
        ! unshare --pid --fork --mount --net --propagation private true 2>/dev/null; then
        missing+=("permission to make namespaces (a container without CAP_SYS_ADMIN?)")
    fi
    [[ -x "$VENV/bin/ray" ]] ||
        missing+=("$VENV/bin/ray (python3 -m venv .venv && .venv/bin/pip install -e .)")
    if ((${#missing[@]})); then
        echo "MISSING: ${missing[*]}" >&2
        echo "On Debian/Ubuntu: apt-get install -y openssh-server openssh-client rsync iproute2" >&2
        echo "RESULT: FAIL (missing prerequisites)"
        exit 2
    fi
    scratch="$(mktemp -d /tmp/raybroker-up.XXXXXX)"
    started=$(date +%s)
    unshare --pid --fork --mount --net --propagation private --mount-proc \
        -- bash "${BASH_SOURCE[0]}" --inside "$scratch" "$@"
    rc=$?
    echo "total (namespace to namespace gone): $(($(date +%s) - started)) s"
    if ((rc == 0 && !keep)); then
        rm -rf "$scratch"
    else
        echo "scratch kept: $scratch (this run's logs in $scratch/tmp/raybroker-up/logs, Ray's in" \
            "$scratch/tmp/ray/session_latest/logs)"
    fi
    exit "$rc"
fi

# ------------------------------------------------------------------------------------------------
# Inside the namespace (PID 1's child tree; nothing here is visible outside it).
# ------------------------------------------------------------------------------------------------
SCRATCH="$2"
shift 2
DEMO=0
SSH_JOBS=0
ORDERS=200
while (($#)); do
    case "$1" in
    --demo) DEMO=1 ;;
    --ssh) SSH_JOBS=1 ;;
    --orders) ORDERS="$2"; shift ;;
    --keep) ;;
    *) echo "unknown option $1 (usage: $0 [--demo] [--orders N] [--ssh] [--keep])" >&2; exit 2 ;;
    esac
    shift
done

mkdir -p "$SCRATCH/home" "$SCRATCH/tmp"
chmod 700 "$SCRATCH/home"
chmod 1777 "$SCRATCH/tmp"
now_ms() { date +%s%3N; }
since() { # seconds since $1 (from now_ms), one decimal
    local d=$(($(now_ms) - $1))
    printf '%d.%d' $((d / 1000)) $((d % 1000 / 100))
}
T0=$(now_ms)
FAILED=()

note() { echo "[$(since "$T0") s] $*"; }
pass() { echo "PASS $1${2:+: $2}"; }
fail() {
    echo "FAIL $1${2:+: $2}"
    FAILED+=("$1")
}
# show the end of a log after a failure
tail_log() { echo "--- last lines of $1 ---"; tail -n "${2:-40}" "$1"; echo "---"; }

summary() {
    note "done"
    if ((${#FAILED[@]})); then
        echo "RESULT: FAIL (${FAILED[*]})"
        exit 1
    fi
    echo "RESULT: PASS"
    exit 0
}

# --- 1. The namespace: loopback up, scratch HOME and /tmp --------------------------------------
ip link set lo up
# HOME: `ray up` writes ~/ray_bootstrap_config.yaml and ~/ray_bootstrap_key.pem; the token is
# ~/.ray/auth_token; the cluster's ~/.bashrc is written by its setup commands.
# /tmp: /tmp/ray (sessions, ray_current_cluster, the local provider's node state), Ray's SSH
# control sockets and its config cache stay private to this run.
# What this run needs from the real /root or /tmp (this checkout's Python may live in
# /root/.pyenv, the checkout itself under /root or /tmp) stays visible through both.
keep_visible() { # $1: /root or /tmp; $2: the scratch directory that replaces it; $3: a path
    local dir="$1" into="$2" path top
    for path in "$(realpath -s -m "$3")" "$(realpath -m "$3")"; do
        [[ "$path" == "$dir"/* ]] || continue
        top="${path#"$dir"/}"
        top="${top%%/*}"
        [[ -e "$into/$top" ]] && continue
        if [[ -d "$dir/$top" ]]; then mkdir "$into/$top"; else touch "$into/$top"; fi
        mount --bind "$dir/$top" "$into/$top"
    done
}
for path in "$VENV/bin/python3" "$VENV" "$REPO"; do
    keep_visible /root "$SCRATCH/home" "$path"
    keep_visible /tmp "$SCRATCH/tmp" "$path"
done
mount --rbind "$SCRATCH/home" /root
mount --rbind "$SCRATCH/tmp" /tmp
# From here on $SCRATCH is hidden under the new /tmp: this run's own files go to $WORK, which is
# $SCRATCH/tmp/raybroker-up seen from outside.
WORK=/tmp/raybroker-up
LOGS="$WORK/logs"
mkdir -p "$LOGS" "$WORK/ssh" "$WORK/nohome"
export HOME=/root TMPDIR=/tmp PATH="$VENV/bin:$PATH"
unset RAY_ADDRESS RAY_AUTH_TOKEN RAY_AUTH_TOKEN_PATH RAY_AUTH_MODE
cd /root

# --- 2. sshd on loopback ------------------------------------------------------------------------
mkdir -p /root/.ssh
mkdir -p -m 0755 /run/sshd # sshd's privilege-separation directory (what its service creates)
chmod 700 /root/.ssh
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host_key"
ssh-keygen -q -t ed25519 -N '' -f /root/.ssh/id_ed25519
cp /root/.ssh/id_ed25519.pub /root/.ssh/authorized_keys
cat >"$WORK/ssh/sshd_config" <<EOF
# Port 22 of this namespace's private network, where lo is the only interface.
Port 22
ListenAddress 0.0.0.0
HostKey $WORK/ssh/host_key
PidFile $WORK/ssh/sshd.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
Subsystem sftp internal-sftp
# ray up and the autoscaler open many sessions at once
MaxStartups 200
MaxSessions 100
LogLevel ERROR
EOF
if ! /usr/sbin/sshd -f "$WORK/ssh/sshd_config" -E "$LOGS/sshd.log"; then
    fail sshd "did not start"
    tail_log "$LOGS/sshd.log"
    summary
fi
SSH=(ssh -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
    -o LogLevel=ERROR -o ConnectTimeout=5)
reachable() { "${SSH[@]}" "root@$1" true 2>/dev/null; }
until reachable "$HEAD_IP" && reachable "$WORKER_IP"; do
    if (($(now_ms) - T0 > DEADLINE_S * 1000)); then
        fail sshd "no SSH on $HEAD_IP/$WORKER_IP after ${DEADLINE_S} s"
        tail_log "$LOGS/sshd.log"
        summary
    fi
    sleep 0.2
done
pass sshd "root@$HEAD_IP and root@$WORKER_IP over loopback"

# --- 3. The token and the cluster config --------------------------------------------------------
ray get-auth-token --generate >/dev/null 2>"$LOGS/token.log" || true
if [[ -s /root/.ray/auth_token ]]; then
    pass token "generated ~/.ray/auth_token"
else
    fail token "ray get-auth-token --generate wrote no token"
    tail_log "$LOGS/token.log"
    summary
fi
CONFIG=/tmp/cluster_local.yaml
sed -e "s|@VENV@|$VENV|g" "$REPO/scripts/cluster_local.yaml" >"$CONFIG"

# --- 4. ray up ----------------------------------------------------------------------------------
note "ray up (head $HEAD_IP, worker $WORKER_IP)"
t=$(now_ms)
# v1 autoscaler: v2 launches no workers for the local provider (Ray issue 57153)
# from the checkout: file_mounts sync "." to ~/raybroker, as with cluster.yaml
if (cd "$REPO" && RAY_UP_enable_autoscaler_v2=0 ray up -y --no-config-cache "$CONFIG") \
    >"$LOGS/ray_up.log" 2>&1; then
    pass "ray up" "head up in $(since "$t") s"
else
    fail "ray up" "exit status $?"
    tail_log "$LOGS/ray_up.log" 60
    summary
fi

export RAY_AUTH_MODE=token # the token itself: ~/.ray/auth_token
# What rsync put on the head: the project, without the virtualenv nor git's files.
synced=/root/raybroker
if [[ -f $synced/pyproject.toml && ! -e $synced/.venv && ! -e $synced/.git ]]; then
    pass file_mounts "~/raybroker synced from the checkout, without .venv and .git"
else
    fail file_mounts "~/raybroker: $(ls -A /root/raybroker 2>&1 | tr '\n' ' ')"
fi

# --- 5. The worker joins ------------------------------------------------------------------------
# `ray status` counts the live nodes under "Active:" (" 2 local.cluster.node" with the v1
# autoscaler, one " 1 node_<id>" line each with v2); poll until there are two.
alive_nodes() {
    ray status --address "$HEAD_IP:6379" 2>/dev/null |
        awk '/^Active:/ {on = 1; next} /^[A-Z]/ {on = 0}
             on && $1 ~ /^[0-9]+$/ {n += $1} END {print n + 0}'
}
t=$(date +%s)
nodes=$(alive_nodes)
while ((nodes < 2)) && (($(date +%s) - t < DEADLINE_S)); do
    sleep 1
    nodes=$(alive_nodes)
done
ray status --address "$HEAD_IP:6379" >"$LOGS/ray_status.log" 2>&1
if ((nodes == 2)); then
    pass "worker joined" "ray status lists 2 active nodes, $(($(date +%s) - t)) s after ray up"
else
    fail "worker joined" "ray status lists $nodes active node(s) after ${DEADLINE_S} s"
    tail_log "$LOGS/ray_status.log" 25
    # the autoscaler's SSH sessions to the worker (setup and start commands) print here
    tail_log /tmp/ray/session_latest/logs/monitor.err 30
fi

# --- 6. Refusals without the token (the drivers in the background: each retries for 3 s) -------
refused_driver() { # $1: label; the rest: env changes for a driver that must be refused
    local label="$1"
    shift
    # RAY_gcs_server_port_wait_time_s: give up after 3 tries, not the default 20 (one a second)
    env -u RAY_AUTH_MODE -u RAY_AUTH_TOKEN -u RAY_AUTH_TOKEN_PATH "$@" HOME="$WORK/nohome" \
        RAY_gcs_server_port_wait_time_s=3 \
        "$VENV/bin/python" - "$HEAD_IP:6379" >"$LOGS/driver_$label.log" 2>&1 <<'EOF'
import sys

import ray

try:
    ray.init(address=sys.argv[1], logging_level="ERROR")
except ConnectionError as exc:
    print("REFUSED", type(exc).__name__, str(exc).splitlines()[0][:200])
    sys.exit(0)
print("CONNECTED", ray.cluster_resources())
sys.exit(1)
EOF
}
refused_driver none &
pid_none=$!
refused_driver wrong RAY_AUTH_MODE=token RAY_AUTH_TOKEN="not-the-token-$RANDOM" &
pid_wrong=$!
# The job API (the dashboard) runs only where ray[default] is installed, as cluster.yaml does.
if "$VENV/bin/python" -c 'import ray.dashboard.optional_deps' 2>/dev/null; then
    JOB_API=1
    code=$("$VENV/bin/python" - "http://$HEAD_IP:8265/api/jobs/" <<'EOF'
import sys
import urllib.error
import urllib.request

try:
    print(urllib.request.urlopen(sys.argv[1], timeout=10).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
except OSError as exc:
    print(f"error {exc}")
EOF
    )
    if [[ "$code" == 401 ]]; then
        pass "job API without token" "HTTP 401"
    else
        fail "job API without token" "answered $code, not 401"
    fi
else
    JOB_API=0
    echo "SKIP job API without token: no dashboard, ray[default] is not installed in $VENV" \
        "(jobs go over SSH with ray exec instead)"
fi

# A job on the cluster, with the token: through the job API, else over SSH on the head; given up
# after $1 seconds (exit status 124).
submit() { # $1: seconds; $2: log file; the rest: the command
    local seconds="$1" log="$2"
    shift 2
    if ((JOB_API)); then
        timeout "$seconds" ray job submit --address "http://$HEAD_IP:8265" \
            --runtime-env-json '{"env_vars": {"RAYBROKER_QUIET": "1"}}' -- "$@" >"$log" 2>&1
    else
        timeout "$seconds" ray exec "$CONFIG" "RAYBROKER_QUIET=1 $(printf '%q ' "$@")" >"$log" 2>&1
    fi
}
((SSH_JOBS)) && JOB_API=0
HOW=$( ((JOB_API)) && echo "ray job submit" || echo "ray exec")

# --- 7. A job with the token: brokers on both nodes, 100 messages across ------------------------
cat >/root/upcheck.py <<'EOF'
"""Run as a Ray job on the cluster: a broker on each node (placed by the resources and labels the
start commands gave them), 100 messages from the head's broker to the worker's, received in
order and committed; then both brokers stopped and their stores deleted."""

import sys

import ray
from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy
from ray.util.state import list_actors

from actors import Contract, MessageType, Queue, Service, Send, start_broker

ray.init(address="auto", logging_level="ERROR")
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
print("nodes:", sorted(nodes.values()))


def on(role):
    return NodeLabelSchedulingStrategy(hard={"raybroker-role": In(role)})


store = "/tmp/raybroker-stores"
a = start_broker("upcheck-a", f"{store}/a.sqlite", resources={"broker_host": 1},
                 scheduling_strategy=on("head"))
b = start_broker("upcheck-b", f"{store}/b.sqlite", resources={"broker_host": 1},
                 scheduling_strategy=on("worker"))
where = {}
for name, broker in (("upcheck-a", a), ("upcheck-b", b)):
    broker.info()  # started and answering
    [actor] = list_actors(filters=[("name", "=", name), ("state", "=", "ALIVE")])
    where[name] = nodes[actor.node_id]
print("brokers:", where)
for broker in (a, b):
    broker.create(MessageType("Ping"))
    broker.create(Contract("C", {"Ping": "initiator"}))
a.create(Queue("InitQ"))
a.create(Service("Init", "InitQ"))
b.create(Queue("TargetQ"))
b.create(Service("Target", "TargetQ", ["C"]))
a.create_route("ToB", "Target", address="ray://upcheck-b")
b.create_route("ToA", "Init", address="ray://upcheck-a")

h = a.begin_dialog("Init", "Target", "C", encryption=False)  # across nodes, no dialog security
a.apply([Send(h, "Ping", [b"%d" % i for i in range(100)])])
got = []
while len(got) < 100:
    groups = b.receive("TargetQ", wait=10, max_groups=10)
    if not groups:
        break
    got += [m.body for g in groups for m in g.messages if m.message_type == "Ping"]
    b.commit(groups)
# the worker's broker's direct channel, from the head: a connection that shows no ticket, or a
# forged one, is closed by the broker without running anything
import socket  # noqa: E402

host, port, _ticket = ray.get(b.actor.open_channel.remote([None]))
closed = []
for first in (b"", b"\x20\x00\x00\x00" + b"0" * 32):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(first)
        try:
            closed.append(s.recv(100) == b"")
        except ConnectionResetError:
            closed.append(True)
        except TimeoutError:
            closed.append(False)
print(f"channel: {host}:{port} closed a connection without a ticket: {all(closed)}")
for broker in (a, b):
    broker.stop(delete_store=True)
ok = got == [b"%d" % i for i in range(100)]
placed = where == {"upcheck-a": "127.0.0.2", "upcheck-b": "127.0.0.3"}
print(f"messages: {len(got)} received, in order: {ok}")
print("UPCHECK", "OK" if ok and placed and len(nodes) == 2 else "BAD")
sys.exit(0 if ok and placed else 1)
EOF
if ((nodes < 2)); then
    # the job places a broker on the worker: without one it would wait for it
    fail "job with token" "not run: the worker did not join"
    if ((DEMO)); then fail "demo job" "not run: the worker did not join"; fi
else
    note "$HOW: brokers on both nodes, 100 messages"
    t=$(now_ms)
    submit 300 "$LOGS/job_upcheck.log" "$VENV/bin/python" /root/upcheck.py
    job_rc=$?
    job_s=$(since "$t")
    grep -E '^(nodes|brokers|messages|channel|UPCHECK):? ' "$LOGS/job_upcheck.log" | sed 's/^/    /'
    if ((job_rc == 0)) && grep -q '^UPCHECK OK' "$LOGS/job_upcheck.log"; then
        pass "job with token" \
            "$HOW: brokers on $HEAD_IP and $WORKER_IP, 100 messages across in order ($job_s s)"
    else
        fail "job with token" "$HOW: exit status $job_rc ($job_s s)"
        tail_log "$LOGS/job_upcheck.log"
    fi
    if grep -q '^channel: .* closed a connection without a ticket: True' "$LOGS/job_upcheck.log"; then
        pass "channel without ticket" "the worker's broker closed it, and one with a forged ticket"
    else
        fail "channel without ticket" "a connection without a valid ticket was not closed"
    fi

    # --- 8. The demo as a job (optional) --------------------------------------------------------
    if ((DEMO)); then
        note "$HOW: raybroker demo --orders $ORDERS --steady-s 5"
        t=$(now_ms)
        submit 900 "$LOGS/job_demo.log" "$VENV/bin/raybroker" demo --orders "$ORDERS" --steady-s 5
        demo_rc=$?
        demo_s=$(since "$t")
        # its summary: from the reconciliation on, without Ray's own lines
        sed -e 's/\x1b\[[0-9;]*m//g' -n -e '/reading every broker/,$p' "$LOGS/job_demo.log" |
            grep -v -E '^\(|^\[|^[0-9]{4}-|^Job |^-+$|^$' | sed 's/^/    /' | head -40
        if ((demo_rc == 0)); then
            pass "demo job" "raybroker demo --orders $ORDERS --steady-s 5 ($demo_s s)"
        else
            fail "demo job" "exit status $demo_rc ($demo_s s)"
            tail_log "$LOGS/job_demo.log" 60
        fi
    fi
fi

# --- 9. The refusals' results -------------------------------------------------------------------
for label in none wrong; do
    pid_var="pid_$label"
    wait "${!pid_var}"
    rc=$?
    what=$([[ $label == none ]] && echo "driver without token" || echo "driver with a wrong token")
    # refused for its token, not for anything else: the GCS said so
    if ((rc == 0)) && grep -q '^REFUSED ConnectionError' "$LOGS/driver_$label.log" &&
        grep -q 'Unauthenticated.*InvalidAuthToken' "$LOGS/driver_$label.log"; then
        pass "$what" "ray.init raised ConnectionError; the GCS: Unauthenticated, InvalidAuthToken"
    else
        fail "$what" "ray.init was not refused with ConnectionError"
        tail_log "$LOGS/driver_$label.log" 20
    fi
done

# --- 10. ray down, and nothing of Ray left ------------------------------------------------------
# Ray's processes in this PID namespace (ps sees no other): its binaries and Python modules live
# under site-packages/ray/, its workers are named ray::...
ray_procs() {
    ps -e -o pid=,args= | grep -E 'site-packages/ray/|ray::|raylet|gcs_server' | grep -v 'grep -E'
}
before=$(ray_procs | wc -l)
note "ray down ($before Ray processes running)"
t=$(now_ms)
if ray down -y "$CONFIG" >"$LOGS/ray_down.log" 2>&1; then
    pass "ray down" "$(since "$t") s"
else
    fail "ray down" "exit status $?"
    tail_log "$LOGS/ray_down.log"
fi
kill "$(cat "$WORK/ssh/sshd.pid")" 2>/dev/null
# `ray stop` returns once it has signalled them: give them a little while to go
t=$(now_ms)
while left=$(ray_procs) && (($(now_ms) - t < 30000)); do sleep 0.5; done
if ((before == 0)); then
    fail "nothing left" "no Ray process was found even before ray down: the check sees nothing"
elif [[ -z "$left" ]]; then
    pass "nothing left" "$before Ray processes before ray down, none after"
else
    fail "nothing left" "still running: $(echo "$left" | cut -c1-120 | tr '\n' ';')"
fi
summary
