#!/usr/bin/env bash
# Run the Eco-FL Flower app with `flwr run .` on a local SuperLink (simulation runtime).
#
#   bash scripts/flwr_run.sh [key=value ...]
#   bash scripts/flwr_run.sh homes=50 dataset.name=digits loop.max_updates=5 train.epochs=1
#
# Arguments override [tool.flwr.app.config] in pyproject.toml (the defaults of
# conf/config.yaml). The script
#   * uses the active environment (FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1:
#     otherwise Flower builds a fresh environment per run and downloads torch),
#   * keeps Flower's state in the project (FLWR_HOME=.flwr),
#   * starts its own SuperLink with as many simulated homes as `homes` says and
#     stops it (and everything it started) on exit, also on failure or Ctrl-C,
#   * exits non-zero when the run did not finish successfully: `flwr run` itself
#     exits 0 even when the ServerApp failed, so the status comes from
#     `flwr ls --format json`.
# Ports: FLWR_LOCAL_SUPERLINK_HTTP_API_PORT (39091), FLWR_LOCAL_CONTROL_API_PORT (39093).
set -euo pipefail
cd "$(dirname "$0")/.."

export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FLWR_HOME="$PWD/.flwr"
export PATH="$PWD/.venv/bin:$PATH"
export FLWR_LOCAL_SUPERLINK_HTTP_API_PORT="${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT:-39091}"
export FLWR_LOCAL_CONTROL_API_PORT="${FLWR_LOCAL_CONTROL_API_PORT:-39093}"
python=.venv/bin/python
health="http://127.0.0.1:${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT}/health"

superlink_up() {
    "$python" -c "import httpx, sys; sys.exit(0 if httpx.get('$health', timeout=0.5).is_success else 1)" 2>/dev/null
}

# Homes, Ray actors and the run-config overrides (strings quoted for TOML), from
# the pyproject defaults and the arguments.
settings=$("$python" - "$@" <<'EOF'
import sys, tomllib
config = tomllib.load(open("pyproject.toml", "rb"))["tool"]["flwr"]["app"]["config"]
flat = {"homes": config["homes"], "simulation.actors": config["simulation"]["actors"],
        "simulation.cpus_per_actor": config["simulation"]["cpus_per_actor"]}
overrides = []
for arg in sys.argv[1:]:
    key, sep, value = arg.partition("=")
    if not sep:
        sys.exit(f"expected key=value, got {arg!r}")
    flat[key] = value
    try:
        tomllib.loads(f"v = {value}")
    except tomllib.TOMLDecodeError:
        value = '"' + value.replace('"', '\\"') + '"'
    overrides.append(f"{key}={value}")
cpus = max(1, round(float(flat["simulation.cpus_per_actor"])))
print(int(flat["homes"]), int(flat["simulation.actors"]), cpus)
print(" ".join(overrides))
EOF
)
read -r homes actors cpus <<<"$(head -n1 <<<"$settings")"
overrides=$(tail -n +2 <<<"$settings")

if superlink_up; then
    echo "A SuperLink already listens on port ${FLWR_LOCAL_SUPERLINK_HTTP_API_PORT}; stop it or choose other ports" \
         "(FLWR_LOCAL_SUPERLINK_HTTP_API_PORT, FLWR_LOCAL_CONTROL_API_PORT)." >&2
    exit 1
fi

mkdir -p "$FLWR_HOME/local-superlink"
# Its own session (process group), so stopping it also stops the simulation and Ray it started.
setsid flower-superlink --insecure --simulation --isolation subprocess \
    --disable-runtime-dependency-installation \
    --control-api-address "127.0.0.1:${FLWR_LOCAL_CONTROL_API_PORT}" \
    --host 127.0.0.1 --port "$FLWR_LOCAL_SUPERLINK_HTTP_API_PORT" \
    --database "$FLWR_HOME/local-superlink/state.db" \
    --log-file "$FLWR_HOME/local-superlink/superlink.log" >/dev/null 2>&1 &
superlink=$!

stop_superlink() {
    kill -TERM -- "-$superlink" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 -- "-$superlink" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -KILL -- "-$superlink" 2>/dev/null || true
}
trap stop_superlink EXIT
trap 'exit 130' INT TERM

for _ in $(seq 100); do
    superlink_up && break
    kill -0 "$superlink" 2>/dev/null || { echo "flower-superlink failed; see $FLWR_HOME/local-superlink/superlink.log" >&2; exit 1; }
    sleep 0.2
done
superlink_up || { echo "flower-superlink did not come up" >&2; exit 1; }

run_config=()
[ -n "$overrides" ] && run_config=(--run-config "$overrides")
flwr run . local --stream "${run_config[@]}" \
    --federation-config "num-supernodes=$homes client-resources-num-cpus=$cpus init-args-num-cpus=$((actors * cpus))"

# The newest run's status: finished:completed is success; anything else fails.
status=$(flwr ls local --format json | "$python" -c '
import json, sys
runs = json.load(sys.stdin).get("runs", [])
run = max(runs, key=lambda r: r.get("created-at", "")) if runs else {}
print(run.get("status", "no run found"))')
echo "run status: $status"
[ "$status" = "finished:completed" ]
