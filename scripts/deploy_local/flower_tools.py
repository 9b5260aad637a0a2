"""Small helpers for scripts/deploy_local.sh (the Flower side of a local deployment).

Run as ``python scripts/deploy_local/flower_tools.py COMMAND ...``:

* ``ports N``: N free TCP ports on 127.0.0.1, space separated.
* ``wait-superlink ADDRESS CA TIMEOUT_S``: wait until the SuperLink at
  ``host:port`` answers ``/health`` over TLS, verified against the CA file.
* ``watch OUT_DIR START_NS UPDATES``: print one line per global update the
  ServerApp writes to ``OUT_DIR/metrics.json`` (the loop rewrites it at every
  checkpoint) and write the seconds from ``START_NS`` (``date +%s%N`` at the
  command's start) to the first update into ``OUT_DIR/first_update_s``.
* ``run-config KEY=VALUE ...``: the pairs as one ``flwr run --run-config``
  string, strings quoted for TOML.
* ``print-homes JSON``: one line per home of a report: devices, rounds,
  measured against predicted sync-round.
* ``devices-joined``: the number of devices in what ``ecofl home status
  --json`` printed on standard input; 0, and nothing on standard error,
  while the home service does not answer yet (it printed nothing).
* ``report OUT_DIR HOMES STATUS_DIR REFUSED STATUS TOTAL_S LINKS EMULATION``: the
  deployment's result as one JSON line (see :func:`report`).

Only the standard library and httpx (a Flower dependency) are used, so the
helpers run wherever Flower is installed.
"""

from __future__ import annotations

import json
import socket
import ssl
import sys
import time
import tomllib
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports on 127.0.0.1 (held open together, so none repeats)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_superlink(address: str, ca_file: str, timeout_s: float) -> bool:
    """True once ``https://ADDRESS/health`` answers, with the server certificate verified against ``ca_file``."""
    import httpx  # Flower's own HTTP client; imported here so `ports` stays instant

    context = ssl.create_default_context(cafile=ca_file)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"https://{address}/health", verify=context, timeout=1.0).is_success:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def _rows(out_dir: Path) -> list[dict]:
    try:
        return json.loads((out_dir / "metrics.json").read_text())
    except (OSError, ValueError):  # not written yet (written atomically, so never half)
        return []


def watch(out_dir: Path, start_ns: int, updates: int) -> None:
    """Report global updates as they land; note when the first one did. Runs until killed or done."""
    seen = 0
    while seen < updates:
        rows = _rows(out_dir)
        elapsed_s = (time.time_ns() - start_ns) / 1e9
        if rows and seen == 0:
            (out_dir / "first_update_s").write_text(f"{elapsed_s:.1f}\n")
        for row in rows[seen:]:
            accuracy = row.get("accuracy")
            shown = "n/a" if accuracy is None else f"{accuracy:.3f}"
            print(f"deploy_local [{elapsed_s:.1f}s]: global update {row['update']}/{updates}: accuracy {shown}, "
                  f"{row.get('homes')} homes, {row['virtual_time']:.1f} s into the run", file=sys.stderr, flush=True)
        seen = max(seen, len(rows))
        time.sleep(0.5)


def run_config(pairs: list[str]) -> str:
    """``key=value`` pairs as a ``--run-config`` string; a value that is not TOML becomes a TOML string."""
    out = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"expected key=value, got {pair!r}")
        try:
            tomllib.loads(f"v = {value}")
        except tomllib.TOMLDecodeError:
            value = json.dumps(value)  # a JSON string is a valid TOML basic string
        out.append(f"{key}={value}")
    return " ".join(out)


def devices_joined(status: str) -> int:
    """The devices of a home's status (``ecofl home status --json``); 0 if there is none (not up yet)."""
    try:
        devices = json.loads(status).get("devices", [])
    except (ValueError, AttributeError):
        return 0
    return len(devices) if isinstance(devices, list) else 0


def home_rounds(status_dir: Path) -> list[dict]:
    """Per home (``home-<i>.status.json``, what ``ecofl home status --json`` printed): devices joined, rounds
    trained, mean measured and predicted sync-round seconds."""
    homes = []
    for path in sorted(status_dir.glob("home-*.status.json"), key=lambda p: int(p.name.split("-")[1].split(".")[0])):
        try:
            status = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        log = status.get("round_log", [])
        measured = [r["pipeline_sync_round_mean_s"] for r in log if r.get("pipeline_sync_rounds")]
        predicted = [r["pipeline_predicted_sync_round_s"] for r in log if "pipeline_predicted_sync_round_s" in r]
        homes.append({
            "home": status.get("name"), "devices": [d["name"] for d in status.get("devices", [])],
            "rounds": status.get("rounds", 0), "refused_peers": status.get("refused", 0),
            "measured_sync_round_s": sum(measured) / len(measured) if measured else None,
            "predicted_sync_round_s": sum(predicted) / len(predicted) if predicted else None,
        })
    return homes


def report(out_dir: Path, homes: int, status_dir: Path, refused: int, status: str, total_s: float,
           links: str, emulation: str = "sleep") -> dict:
    """What deploy_local.sh prints last: updates, final accuracy, homes, devices joined, refused SuperNodes.

    ``homes`` counts the homes the ServerApp connected (summary.json's
    num_homes once the run wrote it, else the number started), ``refused``
    the SuperNodes the SuperLink turned away; ``devices_joined`` the device
    daemons registered at the homes' services at the end (``home_rounds``
    per home, :func:`home_rounds`); ``first_update_s`` and ``total_s`` are
    seconds from the command's start; ``links`` says how the devices were
    connected ("namespaces": tc-shaped links, "loopback": emulated pacing);
    ``emulation`` how the devices were emulated ("cgroup": confined and
    measured for real, "sleep": presets sleeping to the cost model).
    """
    try:
        summary = json.loads((out_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    first = out_dir / "first_update_s"
    per_home = home_rounds(status_dir)
    return {
        "updates": int(summary.get("updates", 0)),
        "final_accuracy": summary.get("final_accuracy"),
        "homes": int(summary.get("num_homes", homes)) if summary else 0,
        "devices_joined": sum(len(h["devices"]) for h in per_home),
        "refused": refused,
        "status": status,
        "first_update_s": float(first.read_text()) if first.exists() else None,
        "total_s": round(total_s, 1),
        "links": links,
        "emulation": emulation,
        "out_dir": str(out_dir),
        "home_rounds": per_home,
    }


def main(argv: list[str]) -> int:
    """Dispatch the command line (see the module docstring)."""
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    command, args = argv[0], argv[1:]
    if command == "ports":
        print(" ".join(map(str, free_ports(int(args[0])))))
    elif command == "wait-superlink":
        return 0 if wait_superlink(args[0], args[1], float(args[2])) else 1
    elif command == "watch":
        watch(Path(args[0]), int(args[1]), int(args[2]))
    elif command == "run-config":
        print(run_config(args))
    elif command == "devices-joined":
        print(devices_joined(sys.stdin.read()))
    elif command == "report":
        out_dir, homes, status_dir, refused, status, total_s, links, emulation = args
        print(json.dumps(report(Path(out_dir), int(homes), Path(status_dir), int(refused), status, float(total_s),
                                links, emulation)))
    elif command == "print-homes":
        for home in json.loads(args[0])["home_rounds"]:
            measured, predicted = home["measured_sync_round_s"], home["predicted_sync_round_s"]
            times = f"{measured:.3f} s measured vs {predicted:.3f} s predicted" if measured and predicted else "-"
            print(f"{home['home']}: {len(home['devices'])} devices, {home['rounds']} rounds, sync-round {times}")
    else:
        print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
