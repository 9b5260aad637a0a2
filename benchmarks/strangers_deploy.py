"""A deployed federation under strangers from many addresses: does it lose a round, and how much slower is it?

Runs ``scripts/deploy_local.sh --homes 2 --devices 2 --updates U --loopback
--emulate sleep --json`` (a SuperLink with TLS, a SuperNode, a home service
and two device daemons per home, on loopback) first undisturbed and then
under attack, and compares the two. The attacker is what issue 44 found
breaking homes: every half second it looks up the TCP ports the homes'
processes (``ecofl home serve``, ``ecofl device serve`` and the workers they
start) listen on, the home services' ports and every round's control,
heartbeat and data ports alike, and sends each new one 100 reconnecting
tricklers, each from a loopback address of its own (127.0.x.y), until the
run ends. (It finds the ports by reading this machine's socket tables, as a
stranger on a home network would by scanning.)

Reported per run: updates, rounds each home trained, peers refused at the
homes, total seconds and seconds per update after the first, and the ratio
of the attacked run to the undisturbed one. One machine, one run each, one
after the other: the ratio moves with the machine's load (given).

``python benchmarks/strangers_deploy.py [--updates 4]`` writes
``benchmarks/results/strangers_deploy.json`` and a table in ``docs/deploy.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the attacker of tests/test_strangers.py

from attacker import Attacker  # noqa: E402
from benchmarks.markdown_section import replace_section  # noqa: E402

HOMES_PROCESSES = ("ecofl home serve", "ecofl device serve", "ecofl.pipeline.runtime.worker")
ATTACKERS_PER_PORT = 100
LISTEN = "0A"  # the LISTEN state in /proc/net/tcp


def home_ports() -> set[int]:
    """The loopback TCP ports that processes of the homes listen on."""
    inodes = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        address, port = local.split(":")
        if state == LISTEN and address == "0100007F":  # 127.0.0.1
            inodes[inode] = int(port, 16)
    ports = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(name in command for name in HOMES_PROCESSES):
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    ports.add(inodes[target[8:-1]])
        except OSError:
            continue  # the process ended while being read
    return ports


class PortAttacker:
    """Every new port of the homes gets 100 reconnecting tricklers from 100 addresses, until stopped."""

    def __init__(self, horizon_s: float):
        self.horizon_s = horizon_s
        self.attacked: list[int] = []
        self.attacker = Attacker(first_source=1000)  # 127.0.4.2 onwards
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._scout = threading.Thread(target=self._scout_loop, daemon=True)

    def __enter__(self) -> "PortAttacker":
        self._scout.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._scout.join()
        for thread in self._threads:
            thread.join()

    def _scout_loop(self) -> None:
        ends = time.monotonic() + self.horizon_s
        while not self._stop.wait(0.5) and time.monotonic() < ends:
            for port in sorted(home_ports() - set(self.attacked)):
                self.attacked.append(port)
                thread = threading.Thread(target=self._attack, args=(port,), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _attack(self, port: int) -> None:
        """Tricklers at ``port`` until the run ends (reconnecting while the port is there)."""
        while not self._stop.is_set():
            self.attacker.trickle(("127.0.0.1", port), 5.0, connections=ATTACKERS_PER_PORT,
                                  sources=ATTACKERS_PER_PORT, reconnect=True)
            if port not in home_ports():
                return


def deploy(updates: int, timeout_s: int) -> dict:
    """One deploy_local.sh run: its JSON report."""
    done = subprocess.run(
        ["bash", "scripts/deploy_local.sh", "--homes", "2", "--devices", "2", "--updates", str(updates),
         "--loopback", "--emulate", "sleep", "--json", "--timeout", str(timeout_s)],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout_s + 120)
    if done.returncode != 0:
        raise RuntimeError(f"deploy_local.sh failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(report: dict) -> dict:
    per_update = None
    if report["updates"] > 1 and report.get("first_update_s") is not None:
        per_update = (report["total_s"] - report["first_update_s"]) / (report["updates"] - 1)
    return {
        "updates": report["updates"], "total_s": report["total_s"], "first_update_s": report.get("first_update_s"),
        "per_update_s": per_update, "home_rounds": [h["rounds"] for h in report["home_rounds"]],
        "refused_peers": [h["refused_peers"] for h in report["home_rounds"]],
        "devices_joined": report["devices_joined"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=4)
    parser.add_argument("--timeout", type=int, default=1500)
    args = parser.parse_args()
    rows = {}
    print(f"undisturbed deployment, {args.updates} updates ...", flush=True)
    load = os.getloadavg()[0]
    rows["undisturbed"] = summary(deploy(args.updates, args.timeout))
    print(json.dumps(rows["undisturbed"]), flush=True)
    print("the same under attack ...", flush=True)
    with PortAttacker(args.timeout) as attack:
        rows["attacked"] = summary(deploy(args.updates, args.timeout))
    rows["attacked"]["ports_attacked"] = len(attack.attacked)
    print(json.dumps(rows["attacked"]), flush=True)
    calm, attacked = rows["undisturbed"], rows["attacked"]
    result = {
        "command": f"python benchmarks/strangers_deploy.py --updates {args.updates}",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "load_before": round(load, 1),
        "attackers_per_port": ATTACKERS_PER_PORT,
        "runs": rows,
        "total_ratio": round(attacked["total_s"] / calm["total_s"], 3),
        "per_update_ratio": (round(attacked["per_update_s"] / calm["per_update_s"], 3)
                             if attacked["per_update_s"] and calm["per_update_s"] else None),
    }
    out = ROOT / "benchmarks" / "results" / "strangers_deploy.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    table = "\n".join([
        f"Measured with `{result['command']}` on {result['machine']} (load {result['load_before']} before; "
        "one run each, one after the other), 2 homes x 2 devices on loopback, devices sleeping to their presets; "
        "the attacker runs on the same cores.",
        "",
        "| run | updates | rounds per home | peers refused per home | total s | s per update after the first |",
        "|---|---:|---|---|---:|---:|",
        *(f"| {name} | {r['updates']} | {r['home_rounds']} | {r['refused_peers']} | {r['total_s']:.0f} | "
          f"{r['per_update_s']:.1f} |" if r["per_update_s"] else
          f"| {name} | {r['updates']} | {r['home_rounds']} | {r['refused_peers']} | {r['total_s']:.0f} | - |"
          for name, r in rows.items()),
        "",
        f"Under attack ({attacked['ports_attacked']} ports of the homes, {ATTACKERS_PER_PORT} reconnecting "
        f"tricklers from {ATTACKERS_PER_PORT} addresses each): total {result['total_ratio']}x, per update "
        f"{result['per_update_ratio']}x the undisturbed run.",
    ])
    if not replace_section(ROOT / "docs" / "deploy.md", table, "strangers_deploy"):
        print("docs/deploy.md has no strangers_deploy section: the table is not written there", file=sys.stderr)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
