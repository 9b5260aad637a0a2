"""The Flower side of a deployment, with real processes on loopback (docs/deploy.md).

* ``scripts/gen_certs.sh`` writes a CA, the SuperLink's certificate and
  SuperNode keys in the formats Flower 1.41 reads;
* ``latency.kind = "measured"`` runs the ServerApp on the wall clock;
* ``scripts/deploy_local.sh``: a SuperLink with TLS and SuperNode
  authentication, two homes (SuperNode with a registered key, home service,
  one device daemon) and one SuperNode whose key was never registered
  (claiming to be home 0); `flwr run` completes with the two homes training
  at their home services, the SuperLink refuses the third, and the script
  leaves no process behind;
* a SuperNode that trusts another CA does not connect and says why.

Every process a test starts (and every descendant seen while it ran) is
stopped by the test too, by pid, also when an assertion fails.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server.config import experiment_from_run_config
from helpers import free_ports
from server.server_app import measured_latency

# Deployments run one at a time (one xdist worker), beside the simulations: a deployment's SuperLink, SuperNodes
# and home services listen on free ports of their own, and none of it uses Ray.
pytestmark = pytest.mark.xdist_group("deploy")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("flower_tools",
                                               ROOT / "scripts" / "deploy_local" / "flower_tools.py")
flower_tools = importlib.util.module_from_spec(_spec)  # deploy_local.sh's helpers, a script rather than a package
_spec.loader.exec_module(flower_tools)
BIN = Path(sys.executable).parent

needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None,
                                   reason="openssl is not installed (apt-get install openssl)")
needs_flower = pytest.mark.skipif(
    not (BIN / "flower-superlink").exists() or not (BIN / "flower-supernode").exists(),
    reason=f"flower-superlink / flower-supernode not installed next to {sys.executable}",
)


def flower_env(flwr_home: Path) -> dict[str, str]:
    """The environment of a Flower process with its own FLWR_HOME (as on a machine of its own)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # the SuperLink starts flower-superexec by name
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
    }


def gen_certs(out_dir: Path, supernodes: int, *extra: str) -> None:
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_certs.sh"), str(out_dir), "--supernodes", str(supernodes),
                    *extra],
                   check=True, capture_output=True, text=True, timeout=120)


# --- processes -----------------------------------------------------------------------------

def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a process, or None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class ProcessTrees:
    """Every process descended from some root pids, as seen by :meth:`poll`; start times guard against pid reuse.

    A SuperLink starts its SuperExec in a session of its own and the SuperExec
    its ServerApp, so process groups alone do not reach them: the trees do.
    """

    def __init__(self) -> None:
        self.roots: set[int] = set()
        self.seen: dict[int, tuple[int, str]] = {}  # pid -> (start time, command line)

    def add_roots(self, *pids: int) -> None:
        self.roots.update(pids)
        self.poll()

    def poll(self) -> None:
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
                children.setdefault(stat[0], []).append(int(entry.name))
        stack = [pid for pid in self.roots if _stat(pid) is not None]
        while stack:
            pid = stack.pop()
            stat = _stat(pid)
            if stat is None:
                continue
            if pid not in self.seen or self.seen[pid][0] == stat[2]:  # re-read: a fresh fork has not exec'd yet
                self.seen[pid] = (stat[2], _cmdline(pid) or self.seen.get(pid, (0, ""))[1])
            stack.extend(children.get(pid, []))

    def alive(self) -> dict[int, str]:
        """The seen processes still running (not zombies), pid -> command line."""
        left = {}
        for pid, (started, cmdline) in self.seen.items():
            stat = _stat(pid)
            if stat is not None and stat[2] == started and stat[1] != "Z":
                left[pid] = cmdline
        return left

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every live process seen, by pid; SIGKILL what is left after ``grace_s``."""
        self.poll()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.alive():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.alive():
                return


def left_behind(trees: ProcessTrees, needle: str, grace_s: float = 15.0) -> list[str]:
    """Processes of ``trees`` still alive, and any process whose command line mentions ``needle``, after ``grace_s``."""
    deadline = time.monotonic() + grace_s
    while True:
        found = [f"{pid}: {cmd[:200]}" for pid, cmd in trees.alive().items()]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in trees.seen and needle in _cmdline(int(entry.name)):
                stat = _stat(int(entry.name))
                if stat is not None and stat[1] != "Z":
                    found.append(f"{entry.name}: {_cmdline(int(entry.name))[:200]}")
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


# --- certificates and the wall clock (fast) ------------------------------------------------

@needs_openssl
def test_gen_certs_writes_what_flower_reads_private_keys_private(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key

    from flwr.cli.supernode.register import try_load_public_key

    out = tmp_path / "certs"
    gen_certs(out, 2, "--hosts", "superlink.home.arpa,192.168.1.10")
    for name in ("ca.key", "server.key", "supernode-0.key", "supernode-1.key"):
        assert (out / name).stat().st_mode & 0o777 == 0o600, name

    verified = subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "server.crt")],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr
    server = x509.load_pem_x509_certificate((out / "server.crt").read_bytes())
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "superlink.home.arpa"} <= set(names.get_values_for_type(x509.DNSName))
    assert {"127.0.0.1", "192.168.1.10"} <= {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}

    # What flower-supernode --auth-supernode-private-key and `flwr supernode register` accept.
    private = load_ssh_private_key((out / "supernode-0.key").read_bytes(), None)
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert try_load_public_key(out / "supernode-0.pub")
    assert (out / "supernode-0.pub").read_text() != (out / "supernode-1.pub").read_text()

    # Again with more SuperNodes: the CA and the existing keys stay, new keys are added.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    gen_certs(out, 3)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {k: after[k] for k in before} == before
    assert set(after) - set(before) == {"supernode-2.key", "supernode-2.pub"}


def test_measured_latency_means_no_latency_model_so_the_wall_clock():
    flat = {"homes": 3, "dataset.name": "digits", "latency.kind": "measured", "latency.mean_s": 10.0,
            "latency.std_s": 3.0, "latency.period_s": ""}
    assert experiment_from_run_config(measured_latency(flat)).setup.latency == {}  # run_server picks WallClock
    paper = {**flat, "latency.kind": "paper"}
    assert measured_latency(paper) == paper
    assert experiment_from_run_config(measured_latency(paper)).setup.latency["kind"] == "paper"


# --- real deployments on loopback ----------------------------------------------------------

@pytest.mark.slow
@needs_openssl
@needs_flower
def test_deploy_local_refuses_an_unregistered_supernode_and_the_run_completes(tmp_path):
    """deploy_local.sh: TLS + node auth, 2 registered homes and 1 unregistered SuperNode claiming home 0.

    Two homes, not three (CI time): each home costs a SuperNode, a home service, a device daemon, warm
    workers and a ClientApp process per message, and a third exercises nothing two do not."""
    work = tmp_path / "deploy"
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    trees = ProcessTrees()
    with open(stdout, "w") as out, open(stderr, "w") as err:
        script = subprocess.Popen(
            ["bash", "scripts/deploy_local.sh", "--homes", "2", "--devices", "1", "--updates", "1",
             "--unregistered", "1", "--json", "--work-dir", str(work), "--emulate", "sleep"],
            cwd=ROOT, stdout=out, stderr=err, start_new_session=True,
        )
    trees.add_roots(script.pid)
    try:
        deadline = time.monotonic() + 600
        while script.poll() is None:
            assert time.monotonic() < deadline, "deploy_local.sh did not finish in 600 s"
            trees.poll()  # every process the deployment starts, for the checks and the clean-up below
            time.sleep(0.3)
        remaining = left_behind(trees, str(work))
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGTERM)  # its trap stops what it started
            try:
                script.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        trees.stop()
    log = stderr.read_text()
    assert script.returncode == 0, log[-3000:]
    assert not remaining, f"deploy_local.sh left processes behind: {remaining}"
    names = " ".join(cmd for _, cmd in trees.seen.values())
    assert "flower-superlink" in names and "flower-supernode" in names and "flower-superexec" in names
    assert "home serve" in names and "device serve" in names  # the homes ran their services and daemons

    result = json.loads(stdout.read_text().strip().splitlines()[-1])
    assert {"updates", "final_accuracy", "homes", "devices_joined", "refused"} <= set(result)
    assert result["updates"] == 1 and result["homes"] == 2 and result["refused"] == 1
    assert result["devices_joined"] == 2  # one daemon per home (kept small: CI time)
    assert all(home["rounds"] >= 1 and home["measured_sync_round_s"] > 0 for home in result["home_rounds"])
    assert result["final_accuracy"] > 0.2, result  # digits: chance is 0.1
    assert result["status"] == "finished:completed"

    logs = work / "logs"
    # The SuperLink served TLS only, and refused the unknown key when it tried to join.
    superlink_log = (logs / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1:" in superlink_log
    assert "No SuperNode found with the given public key" in superlink_log
    intruder = (logs / "unregistered-0.log").read_text()
    assert "Failed to activate SuperNode" in intruder
    assert "Received" not in intruder and "ROUND" not in intruder  # it never got a message
    for home in range(2):
        assert "Received" in (logs / f"supernode-{home}.log").read_text()
    # It claimed to be home 0: had it joined, the ServerApp would have stopped with
    # "nodes ... both are home 0". The run used exactly the two registered homes.
    summary = json.loads((work / "out" / "summary.json").read_text())
    assert summary["num_homes"] == 2 and summary["updates"] == 1 and summary["failed_total"] == 0
    assert "refused" in log
    assert "Traceback" not in log  # it waited for the home services without printing their absence
    # What the deployment wrote is its owner's only (keys, secrets, logs that hold tokens, Flower's state
    # database and its write-ahead log); certificates and public keys alone are readable by others.
    assert (work / "superlink" / "state.db").exists()
    exposed = [f"{path.relative_to(work)}: {oct(path.lstat().st_mode & 0o777)}" for path in [work, *work.rglob("*")]
               if not path.is_symlink() and path.suffix not in (".crt", ".pub") and path.lstat().st_mode & 0o077]
    assert not exposed, exposed


@needs_openssl
@needs_flower
def test_a_supernode_trusting_another_ca_does_not_connect_and_says_why(tmp_path):
    certs, other = tmp_path / "certs", tmp_path / "other-ca"
    gen_certs(certs, 1)
    gen_certs(other, 0)  # a second CA: the SuperLink's certificate is not signed by it
    port, node_port = free_ports(2)
    address = f"127.0.0.1:{port}"
    trees = ProcessTrees()
    superlink_log = open(tmp_path / "superlink.log", "w")
    superlink = subprocess.Popen(
        [BIN / "flower-superlink", "--ssl-ca-certfile", certs / "ca.crt", "--ssl-certfile", certs / "server.crt",
         "--ssl-keyfile", certs / "server.key", "--enable-supernode-auth", "--disable-runtime-dependency-installation",
         "--host", "127.0.0.1", "--port", str(port)],
        env=flower_env(tmp_path / "superlink-home"), stdout=superlink_log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    trees.add_roots(superlink.pid)
    try:
        assert wait_health(address, certs / "ca.crt", 60), (tmp_path / "superlink.log").read_text()[-2000:]
        trees.poll()
        admin = tmp_path / "admin"
        write_connection(admin, address, certs / "ca.crt")
        registered = subprocess.run([BIN / "flwr", "supernode", "register", certs / "supernode-0.pub", "deploy"],
                                    env=flower_env(admin), capture_output=True, text=True, timeout=60)
        assert registered.returncode == 0, registered.stdout + registered.stderr  # so only the CA is wrong

        # Output to a file, not a pipe: the SuperNode's SuperExec would hold a pipe open, and
        # it exits only once its parent is gone, i.e. reaped (a zombie still "exists").
        with open(tmp_path / "node.log", "w") as node_log:
            node = subprocess.Popen(
                [BIN / "flower-supernode", "--superlink", address, "--root-certificates", other / "ca.crt",
                 "--auth-supernode-private-key", certs / "supernode-0.key",
                 "--node-config", "partition-id=0 num-partitions=1", "--host", "127.0.0.1", "--port", str(node_port)],
                env=flower_env(tmp_path / "node-home"), stdout=node_log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        trees.add_roots(node.pid)
        node.wait(timeout=120)
        output = (tmp_path / "node.log").read_text()
        assert node.returncode != 0, output[-2000:]
        assert "CERTIFICATE_VERIFY_FAILED" in output and "SSL/TLS handshake error" in output, output[-2000:]
        assert "Failed to initialize the connection to the SuperLink" in output

        # The SuperLink goes on: healthy, the node registered but never online.
        assert wait_health(address, certs / "ca.crt", 10)
        listed = subprocess.run([BIN / "flwr", "supernode", "ls", "deploy", "--format", "json"],
                                env=flower_env(admin), capture_output=True, text=True, timeout=60)
        nodes = json.loads(listed.stdout)["nodes"]
        assert len(nodes) == 1 and nodes[0]["status"] == "registered", nodes
        # The other CA does not verify the SuperLink for plain HTTPS clients either.
        assert not wait_health(address, other / "ca.crt", 2)
    finally:
        trees.stop()
        superlink_log.close()
    assert not left_behind(trees, str(tmp_path), grace_s=5)


def wait_health(address: str, ca_file: Path, timeout_s: float) -> bool:
    """True once the SuperLink's /health answers over TLS verified against ``ca_file``."""
    return flower_tools.wait_superlink(address, str(ca_file), timeout_s)


def write_connection(flwr_home: Path, address: str, ca_file: Path) -> None:
    """A `flwr` connection named ``deploy`` (Flower 1.41: $FLWR_HOME/config.toml, not pyproject.toml)."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\naddress = "{address}"\n'
        f'root-certificates = "{ca_file}"\n'
    )
