#!/usr/bin/env bash
# Deploy an Eco-FL federation on this machine, the way it runs on real machines:
# a SuperLink with TLS and SuperNode authentication, one SuperNode per home with its
# own registered key, `flwr run` until U global updates on the wall clock.
#
#   bash scripts/deploy_local.sh --homes H --devices D --updates U [--json] [options] [key=value ...]
#
#   --homes H          homes, one SuperNode each (partition-id 0..H-1)          [3]
#   --devices D        device daemons per home (`ecofl device serve`, emulating the
#                      presets nano-10w, tx2-maxn, nx in turn); each home also runs
#                      its home service (`ecofl home serve`, the portal device),
#                      which plans every round on the devices joined. 0: homes
#                      train in their ClientApp process                          [3]
#   --updates U        global updates to run (loop.max_updates)                   [5]
#   --json             the last line of stdout is one JSON object: updates,
#                      final_accuracy, homes, devices_joined, refused (and status,
#                      first_update_s, total_s, links, out_dir, home_rounds)
#   --unregistered N   also start N SuperNodes whose keys were never registered,
#                      claiming to be homes 0..N-1; the SuperLink must refuse them
#                      (counted in `refused`)                                    [0]
#   --work-dir DIR     keep certificates, logs and outputs in DIR (kept afterwards);
#                      default: a fresh .flwr/deploy.XXXXXX, removed after a
#                      successful run and kept after a failed one
#   --timeout S        give up after S seconds                                 [900]
#   --loopback         keep devices on loopback even as root (no namespaces)
#   --emulate MODE     cgroup: every device daemon runs in a cgroup of its own with
#                      its preset's cores and memory, measures itself at join (no
#                      preset claimed) and trains at its real pace; the portal's
#                      stage likewise. sleep: daemons claim their preset and sleep
#                      to the cost model. Default: cgroup where cgroups are
#                      writable and the devices' quotas fit this machine, else
#                      sleep (said in one line)                               [auto]
#   key=value          run-config overrides ([tool.flwr.app.config] keys), after
#                      the deployment defaults below
#
# Every process it starts gets its own session and is stopped, with all its
# descendants, on exit, on failure and on Ctrl-C. As root (where network namespaces
# work) every device daemon runs in a namespace of its own whose link is shaped by
# `tc tbf` (100 Mbps, the presets' links), bridged to its home service's address;
# otherwise devices run on loopback and the pipeline's emulation paces their links.
# The SuperLink and SuperNodes listen on 127.0.0.1, home services on loopback or on
# the address of the home network created here.
# Each process has its own FLWR_HOME under the work directory, as if on its own
# machine (and so no two install the app into one directory at once).
set -euo pipefail
umask 077  # what the deployment writes (keys, secrets, Flower's state database, logs with tokens) is its owner's
cd "$(dirname "$0")/.."
root=$PWD
start_ns=$(date +%s%N)

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
say() {  # progress on stderr, with the seconds since the command started
    echo "deploy_local [$(awk "BEGIN { printf \"%.1f\", ($(date +%s%N) - $start_ns) / 1e9 }")s]: $*" >&2
}
die() { say "error: $*"; exit 1; }

homes=3 devices=3 updates=5 json="" unregistered=0 work="" timeout_s=900 overrides=() loopback="" emulate=auto
while [ $# -gt 0 ]; do
    case "$1" in
        --homes) homes="${2:?--homes needs a number}"; shift 2 ;;
        --devices) devices="${2:?--devices needs a number}"; shift 2 ;;
        --updates) updates="${2:?--updates needs a number}"; shift 2 ;;
        --json) json=1; shift ;;
        --unregistered) unregistered="${2:?--unregistered needs a number}"; shift 2 ;;
        --work-dir) work="${2:?--work-dir needs a directory}"; shift 2 ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
        --loopback) loopback=1; shift ;;
        --emulate) emulate="${2:?--emulate needs cgroup or sleep}"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *=*) overrides+=("$1"); shift ;;
        *) say "unknown argument $1"; usage >&2; exit 2 ;;
    esac
done
for value in "$homes" "$updates" "$timeout_s"; do
    [[ "$value" =~ ^[1-9][0-9]*$ ]] || die "--homes, --updates and --timeout must be positive numbers"
done
for value in "$devices" "$unregistered"; do
    [[ "$value" =~ ^[0-9]+$ ]] || die "--devices and --unregistered must be numbers"
done
[[ "$emulate" =~ ^(auto|cgroup|sleep)$ ]] || die "--emulate must be cgroup or sleep, got $emulate"

python="$root/.venv/bin/python"
tools="$root/scripts/deploy_local/flower_tools.py"
export PATH="$root/.venv/bin:$PATH"
# Use the active environment: otherwise Flower builds an environment per run and downloads torch.
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1  # no calls home from a local deployment

keep_work=1
if [ -z "$work" ]; then
    mkdir -p "$root/.flwr"
    work=$(mktemp -d "$root/.flwr/deploy.XXXXXX")
    keep_work=""
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
certs="$work/certs" logs="$work/logs" out="$work/out"
mkdir -p "$logs" "$out"
: >"$work/pids"

# --- stopping everything we started, whatever happens --------------------------------
started=()   # pids of the processes we started (each the leader of its own session)
watcher=""
succeeded=""

process_tree() {  # the pids and all their descendants (SuperExec, ServerApp, ClientApps)
    local pids=("$@") i=0
    while [ "$i" -lt "${#pids[@]}" ]; do
        pids+=($(ps -o pid= --ppid "${pids[$i]}" || true))
        i=$((i + 1))
    done
    echo "${pids[@]}"
}

stop_all() {
    local pids alive
    [ -n "$watcher" ] && kill "$watcher" 2>/dev/null || true
    [ "${#started[@]}" -gt 0 ] || return 0
    # The whole tree first: a SuperExec runs in a session of its own and would
    # outlive its SuperLink if we only signalled process groups.
    pids=$(process_tree "${started[@]}")
    kill -TERM $pids 2>/dev/null || true
    for _ in $(seq 100); do
        alive=""
        for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive+=" $pid"; done
        [ -z "$alive" ] && break
        sleep 0.2
    done
    if [ -n "$alive" ]; then
        say "still running 20 s after SIGTERM, killed:$(for pid in $alive; do echo -n " $(ps -o comm= -p "$pid")[$pid]"; done)"
        kill -KILL $alive 2>/dev/null || true
    fi
    started=()
    "$python" -m ecofl.cgroups sweep >/dev/null 2>&1 || true  # the cgroups of confined daemons killed above
}

on_exit() {
    local code=$?
    stop_all
    if [ -z "$keep_work" ] && [ -n "$succeeded" ]; then
        rm -rf "$work"
    elif [ -z "$succeeded" ]; then
        say "logs kept in $logs"
    fi
    exit "$code"
}
trap on_exit EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

start() {  # start NAME CMD...: in its own session, output to logs/NAME.log; sets $last_pid
    local name=$1; shift
    setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
    last_pid=$!
    started+=("$last_pid")
    echo "$name $last_pid" >>"$work/pids"  # for whoever must clean up after a kill -9 of this script
}

# --- certificates and keys -------------------------------------------------------------
bash "$root/scripts/gen_certs.sh" "$certs" --supernodes "$homes" >"$logs/gen_certs.log"
if [ "$unregistered" -gt 0 ]; then
    # Keys nobody registers: their own directory, so they are valid keys of the right
    # kind, only unknown to the SuperLink. (gen_certs also makes a CA there; unused.)
    bash "$root/scripts/gen_certs.sh" "$work/unregistered" --supernodes "$unregistered" >>"$logs/gen_certs.log"
fi

read -r -a ports <<<"$("$python" "$tools" ports $((1 + 2 * homes + unregistered)))"
superlink_address="127.0.0.1:${ports[0]}"

# --- the SuperLink ---------------------------------------------------------------------
mkdir -p "$work/superlink"
FLWR_HOME="$work/superlink" start superlink flower-superlink \
    --ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/server.crt" --ssl-keyfile "$certs/server.key" \
    --enable-supernode-auth --disable-runtime-dependency-installation \
    --host 127.0.0.1 --port "${ports[0]}" --database "$work/superlink/state.db"
superlink=$last_pid
"$python" "$tools" wait-superlink "$superlink_address" "$certs/ca.crt" 60 \
    || die "the SuperLink did not come up on $superlink_address; see $logs/superlink.log"
say "SuperLink on https://$superlink_address (TLS, SuperNode authentication)"

# The administrator's `flwr` connection (Flower 1.41 keeps SuperLink connections in
# $FLWR_HOME/config.toml, no longer in pyproject.toml).
export FLWR_HOME="$work/admin"
mkdir -p "$FLWR_HOME"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "deploy-local"

[superlink.deploy-local]
address = "$superlink_address"
root-certificates = "$certs/ca.crt"
EOF

# --- register the homes' public keys, start their SuperNodes ---------------------------
for ((i = 0; i < homes; i++)); do
    flwr supernode register "$certs/supernode-$i.pub" deploy-local --name "home-$i" --format json \
        >"$logs/register-$i.json" 2>&1 || die "registering home $i failed: $(cat "$logs/register-$i.json")"
done
say "registered $homes SuperNode public keys"

# --- per home: the home network, the home service and its device daemons --------------
presets=(nano-10w tx2-maxn nx)
if [ "$devices" -gt 0 ] && [ "$emulate" != sleep ]; then
    # Confined devices: every home's portal stage and daemons together must fit this machine's cores.
    why_not=$("$python" - "$homes" "$devices" "${presets[@]}" <<'PY'
import sys
from ecofl.cgroups import DeviceLimits, find_hierarchy
from ecofl.devices import host_cores, preset
from ecofl.errors import UserError
from ecofl.pipeline.runtime.confinement import check_fits
homes, devices, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
found = find_hierarchy()
if isinstance(found, str):
    print(f"no writable cgroups: {found}")
    sys.exit()
per_home = ["nano-10w"] + [names[j % len(names)] for j in range(devices)]
limits = {i: DeviceLimits(preset(n).speed, preset(n).memory_bytes) for i, n in enumerate(per_home * homes)}
try:
    check_fits(limits, host_cores())
except UserError as error:
    print(error)
PY
)
    if [ -z "$why_not" ]; then
        emulate=cgroup
        say "devices confined by cgroups (each daemon at its preset's cores and memory, measured for real)"
    elif [ "$emulate" = cgroup ]; then
        die "cannot confine the devices: $why_not"
    else
        emulate=sleep
        say "devices sleep to the cost model ($why_not)"
    fi
fi
home_port() { echo "${ports[$((1 + homes + unregistered + $1))]}"; }
# As root: each home's devices in network namespaces with tc-shaped links.
networks=""
if [ "$devices" -gt 0 ] && [ -z "$loopback" ]; then
    why_not=$("$python" -c 'from ecofl.net.netns import unavailable_reason as u; print(u() or "")')
    if [ -z "$why_not" ]; then
        networks="$work/networks.json"
        start home-networks "$python" "$root/scripts/deploy_local/home_networks.py" "$homes" "$devices" 100 "$networks"
        for _ in $(seq 300); do [ -f "$networks" ] && break; kill -0 "$last_pid" 2>/dev/null || break; sleep 0.2; done
        [ -f "$networks" ] || die "building the home networks failed: $(tail -n 5 "$logs/home-networks.log")"
        say "home networks: one namespace per device, links shaped by tc tbf at 100 Mbps"
    else
        say "devices on loopback ($why_not); the pipeline's emulation paces their links"
    fi
fi
home_host() {  # the address of home $1's service: its home network's portal address, or loopback
    if [ -n "$networks" ]; then
        "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["homes"][int(sys.argv[2])]["portal"])' \
            "$networks" "$1"
    else
        echo 127.0.0.1
    fi
}
in_namespace() {  # the command prefix that runs in home $1's device $2's namespace (none on loopback)
    if [ -n "$networks" ]; then
        echo ip netns exec "$("$python" -c 'import json, sys
print(json.load(open(sys.argv[1]))["homes"][int(sys.argv[2])]["namespaces"][int(sys.argv[3])])' "$networks" "$1" "$2")"
    fi
}
if [ "$devices" -gt 0 ]; then
    for ((i = 0; i < homes; i++)); do
        mkdir -p "$work/home-$i"
        openssl rand -hex 32 >"$work/home-$i/secret"  # the home's secret (mode 600), never on a command line
        # --every-device: the demo shows every home's pipeline across its devices; a home service plans
        # a confined home's rounds on the devices predicted fastest, for the digits CNN maybe the portal alone.
        start "home-service-$i" ecofl home serve --listen "$(home_host "$i"):$(home_port "$i")" --name "home-$i" \
            --secret-file "$work/home-$i/secret" --portal-preset nano-10w ${networks:+--kernel-links} \
            --emulate "$emulate" --every-device
        for ((j = 0; j < devices; j++)); do
            preset=${presets[$((j % 3))]}
            if [ "$emulate" = cgroup ]; then  # its preset's cores; its budget plus its and its worker's runtimes
                read -r cores memory <<<"$("$python" -c 'import sys; from ecofl.devices import preset as p
d = p(sys.argv[1]); print(d.speed, d.memory_bytes + (1 << 30))' "$preset")"
                ECOFL_HOME_SECRET_FILE="$work/home-$i/secret" start "device-$i-$j" \
                    "$python" -m ecofl.cgroups run --cores "$cores" --memory-bytes "$memory" --label "home-$i-$j" -- \
                    $(in_namespace "$i" "$j") "$root/.venv/bin/ecofl" device serve \
                    --home "$(home_host "$i"):$(home_port "$i")" --name "home-$i-$preset-$j"
            else
                ECOFL_HOME_SECRET_FILE="$work/home-$i/secret" start "device-$i-$j" $(in_namespace "$i" "$j") \
                    "$root/.venv/bin/ecofl" device serve \
                    --home "$(home_host "$i"):$(home_port "$i")" --name "home-$i-$preset-$j" --preset "$preset"
            fi
        done
    done
    for ((i = 0; i < homes; i++)); do
        joined=0
        for _ in $(seq 120); do
            joined=$(ecofl home status --home "$(home_host "$i"):$(home_port "$i")" --secret-file "$work/home-$i/secret" \
                --json 2>/dev/null | "$python" "$tools" devices-joined || true)  # 0 until it answers
            [ "$joined" -ge "$devices" ] && break
            sleep 1
        done
        [ "$joined" -ge "$devices" ] || die "only $joined of $devices devices joined home $i; see $logs/device-$i-*.log"
    done
    say "$((homes * devices)) device daemons joined $homes home services"
fi

supernodes=()
for ((i = 0; i < homes; i++)); do
    mkdir -p "$work/home-$i"
    node_config="partition-id=$i num-partitions=$homes"
    if [ "$devices" -gt 0 ]; then
        node_config+=" home-service=\"$(home_host "$i"):$(home_port "$i")\" home-secret-file=\"$work/home-$i/secret\""
    fi
    FLWR_HOME="$work/home-$i" start "supernode-$i" flower-supernode \
        --superlink "$superlink_address" --root-certificates "$certs/ca.crt" \
        --auth-supernode-private-key "$certs/supernode-$i.key" \
        --node-config "$node_config" \
        --host 127.0.0.1 --port "${ports[$((1 + i))]}"
    supernodes+=("$last_pid")
done
intruders=()
for ((j = 0; j < unregistered; j++)); do
    mkdir -p "$work/unregistered-$j"
    FLWR_HOME="$work/unregistered-$j" start "unregistered-$j" flower-supernode \
        --superlink "$superlink_address" --root-certificates "$certs/ca.crt" \
        --auth-supernode-private-key "$work/unregistered/supernode-$j.key" \
        --node-config "partition-id=$j num-partitions=$homes" \
        --host 127.0.0.1 --port "${ports[$((1 + homes + j))]}"
    intruders+=("$last_pid")
done

# Wait until every registered home is online; a SuperNode that exits is an error now,
# not a ServerApp waiting out its connect timeout later.
online=0
for _ in $(seq 120); do
    for ((i = 0; i < homes; i++)); do
        kill -0 "${supernodes[$i]}" 2>/dev/null \
            || die "the SuperNode of home $i exited: $(tail -n 5 "$logs/supernode-$i.log")"
    done
    online=$(flwr supernode ls deploy-local --format json 2>/dev/null | "$python" -c '
import json, sys
print(sum(node["status"] == "online" for node in json.load(sys.stdin).get("nodes", [])))' || echo 0)
    [ "$online" -ge "$homes" ] && break
    sleep 1
done
[ "$online" -ge "$homes" ] || die "only $online of $homes SuperNodes came online"
say "$homes SuperNodes online"

# --- the run ---------------------------------------------------------------------------
# Deployment defaults: the wall clock (homes report the time they measured), the offline
# digits dataset split IID (accuracy means something with few homes), one group up to
# three homes, U updates whatever the accuracy, metrics written at every update. RT is
# fixed at 3600 s: the profiling query times a round in the ClientApp's process (well
# under a second), while a round at the home service starts D+1 pipeline workers and
# trains on emulated boards (one to two minutes on one shared machine); a threshold
# derived from the probe would park every home as "waiting" (Eco-FL Algorithm 1) after
# its first real round.
num_groups=$((homes > 3 ? 2 : 1))
config=$("$python" "$tools" run-config \
    "homes=$homes" "latency.kind=measured" "dataset.name=digits" "partition.scheme=iid" \
    "grouping.num_groups=$num_groups" "grouping.rt=3600" "loop.homes_per_round=$homes" "loop.max_updates=$updates" \
    "loop.stop_at_target=false" "loop.checkpoint_every=1" "train.epochs=1" "train.batch_size=32" "server.eval_samples=" \
    "server.connect_timeout_s=120" "out_dir=$out" "${overrides[@]}")
"$python" "$tools" watch "$out" "$start_ns" "$updates" &
watcher=$!

say "flwr run: $updates global updates over $homes homes (log: $logs/flwr-run.log)"
# In the background so that Ctrl-C runs our trap at once instead of after `flwr run`.
start flwr-run timeout "$timeout_s" flwr run "$root" deploy-local --stream --run-config "$config"
run_pid=$last_pid
wait "$run_pid" || true
run_id=$(sed -n 's/.*Successfully started run \([0-9]*\).*/\1/p' "$logs/flwr-run.log" | head -n1)
[ -n "$run_id" ] || die "flwr run did not start a run: $(tail -n 5 "$logs/flwr-run.log")"
# `flwr run` exits 0 even when the ServerApp failed: ask the SuperLink how the run ended.
status=$(flwr ls deploy-local --run-id "$run_id" --format json 2>/dev/null | "$python" -c '
import json, sys
runs = json.load(sys.stdin).get("runs", [])
print(runs[0]["status"] if runs else "unknown")' || echo unknown)
total_s=$(awk "BEGIN { print ($(date +%s%N) - $start_ns) / 1e9 }")

# --- refused SuperNodes ----------------------------------------------------------------
# The SuperLink logs each activation with an unknown key; a refused SuperNode exits 305.
for ((j = 0; j < unregistered; j++)); do
    code=0
    for _ in $(seq 30); do kill -0 "${intruders[$j]}" 2>/dev/null || break; sleep 1; done
    if kill -0 "${intruders[$j]}" 2>/dev/null; then
        say "unregistered SuperNode $j is still running: it was NOT refused"
    else
        wait "${intruders[$j]}" || code=$?
        say "unregistered SuperNode $j refused (exit $code), its log says: $(grep -m1 -o '\[code: [0-9]*\] Failed to activate SuperNode' "$logs/unregistered-$j.log" || echo '?')"
    fi
done
refused=$({ grep -o "public key: b'[^']*', exception: No SuperNode found with the given public key" \
    "$logs/superlink.log" || true; } | sort -u | wc -l)

for ((i = 0; i < (devices > 0 ? homes : 0); i++)); do
    ecofl home status --home "$(home_host "$i"):$(home_port "$i")" --secret-file "$work/home-$i/secret" --json \
        >"$work/home-$i.status.json" 2>/dev/null || echo '{}' >"$work/home-$i.status.json"
done
result=$("$python" "$tools" report "$out" "$homes" "$work" "$refused" "$status" "$total_s" \
    "$([ -n "$networks" ] && echo namespaces || echo loopback)" "$([ "$emulate" = cgroup ] && echo cgroup || echo sleep)")
"$python" "$tools" print-homes "$result" >&2
kill "$watcher" 2>/dev/null || true
watcher=""
read -r got_updates accuracy <<<"$("$python" -c 'import json, sys; r = json.loads(sys.argv[1]); print(r["updates"], r["final_accuracy"])' "$result")"

say "run $run_id: $status, $got_updates global updates, final accuracy $accuracy, $refused SuperNode(s) refused"
if [ "$status" = "finished:completed" ] && [ "$got_updates" -ge "$updates" ] && [ "$refused" -ge "$unregistered" ]; then
    succeeded=1
fi
stop_all
if [ -n "$json" ]; then
    echo "$result"
else
    echo "final accuracy $accuracy after $got_updates global updates ($homes homes, $refused refused)"
fi
[ -n "$succeeded" ] || { say "the deployment did not complete as asked; see $logs"; exit 1; }
