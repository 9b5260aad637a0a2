"""Strangers at the door: whatever anyone without the home's secret sends to a port of a home, it keeps training.

An attacker on the home network (here: loopback addresses of its own,
127.0.0.2 and up, as a stranger on a home network has its own address; the
home's processes are on 127.0.0.1) tries what once knocked a home out of the
federation (issue 25):

- a handshake that trickles a byte every half second, and 100 silent
  connections (they once blocked the heartbeat monitor's only thread);
- malformed hellos: ``"device": 1e400`` (OverflowError), 2,000 nested
  brackets (RecursionError), negative and huge device numbers, a length
  prefix of 2**63, an oversized header, bytes that are not JSON;
- a flood of trickling connections, and one up to the open-file limit
  (a home service once stopped accepting for good at EMFILE).

Every port of a home is a :class:`~ecofl.net.door.Door`; these tests hold it
to what the issue asks: the home completes every sync-round, no device is
declared failed, no thread dies, each refusal is one log line per source,
and a legitimate peer is admitted at once afterwards. Measured figures are
printed (``pytest -s``).
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from ecofl.deploy.device_profile import describe_device
from ecofl.deploy.home_status import home_status
from ecofl.deploy.service_messages import DAEMON
from ecofl.deploy.service_messages import DaemonBeat
from ecofl.net.auth import CONTROL, HELLO
from ecofl.net.dial import dial
from ecofl.net.door import Door, DoorLimits
from ecofl.net.heartbeat import HEARTBEAT, HeartbeatMonitor
from ecofl.net.knock import knock_frame
from ecofl.net.liveness import LivenessSettings
from ecofl.net.mesh import DataListener, data_purpose
from ecofl.net.netns import HomeNetwork, unavailable_reason
from ecofl.net.preauth import parse_bounded, read_preauth
from ecofl.net.schema import MalformedMessage, encode
from ecofl.net.wire import recv_message, send_message
from ecofl.pipeline.runtime.admission import Arrivals
from attacker import MALFORMED, Attacker, attack_every_port, connect_from, hello, legit_join, stranger
from helpers import SECRET, answer_of, wait_for
from pipeline_kit import pool

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]
LEGIT = "127.0.0.1"  # where the home's own processes connect from
NETNS = unavailable_reason()
#: A peer with the secret is admitted at once, attack or not: well under the 10 s a stranger's handshake may
#: last, which is what a peer queued behind strangers would wait (generous: a loaded machine is slow).
ADMITTED_AT_ONCE_S = 5.0


# -- the parser ----------------------------------------------------------------------------


def test_the_preauth_parser_raises_only_malformed_message_whatever_the_bytes():
    """Every malformed hello, and 2,000 random mutations of a good one, end in MalformedMessage and nothing else."""
    good = hello()[8:]
    rng = random.Random(25)
    bodies = [payload[8:] for payload in MALFORMED.values() if len(payload) > 8]
    for _ in range(2000):
        body = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(body))
            body[position:position + rng.randint(0, 3)] = bytes(rng.choice(b'[]{}",:0123456789e-.+ \\naNIfxy')
                                                               for _ in range(rng.randint(0, 4)))
        bodies.append(bytes(body))
    for body in bodies:
        try:
            HELLO.decode(parse_bounded(body))
        except MalformedMessage:
            pass
    assert HELLO.decode(parse_bounded(good)).device == 1


@pytest.mark.parametrize("what", [w for w in MALFORMED if w != "garbage"])
def test_each_malformed_hello_is_one_malformed_message(what):
    a, b = socket.socketpair()
    with a, b:
        a.sendall(MALFORMED[what])
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(MalformedMessage):
            read_preauth(b, HELLO, time.monotonic() + 5)


def test_a_trickled_message_ends_at_the_handshakes_deadline_not_per_read():
    a, b = socket.socketpair()
    stop = threading.Event()

    def trickle() -> None:
        for byte in hello():
            if stop.wait(0.1):
                return
            a.send(bytes([byte]))

    thread = threading.Thread(target=trickle)
    thread.start()
    try:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            read_preauth(b, HELLO, start + 1.0)  # every read gets a byte within 0.1 s; the whole cannot be late
        print(f"\ntrickle cut off after {time.monotonic() - start:.2f} s (deadline 1 s)")
    finally:
        stop.set()
        thread.join()
        a.close(), b.close()


# -- one door ------------------------------------------------------------------------------


@contextmanager
def door(limits: DoorLimits = DoorLimits(), purpose: str = CONTROL):
    admitted: list[int] = []

    def take(peer) -> None:
        admitted.append(peer.device)
        peer.channel.close()

    with Door(LEGIT, 0, SECRET, lambda p: p == purpose, take, name="test", limits=limits) as d:
        yield d, admitted


def test_trickling_and_silent_strangers_are_cut_off_at_the_knock_deadline_and_never_hold_up_a_peer():
    with door(DoorLimits(knock_deadline_s=1.5, waiting_per_source=4)) as (d, admitted):
        attacker = Attacker()
        stop = threading.Event()
        hung_up: list[float] = []

        def trickle() -> None:
            start = time.monotonic()
            with connect_from(d.address, stranger(0)) as sock:
                for byte in hello():  # where a knock belongs, a byte at a time
                    try:
                        sock.send(bytes([byte]))
                        if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                            break
                    except BlockingIOError:
                        pass
                    except OSError:
                        break
                    if stop.wait(0.3):
                        return
                hung_up.append(time.monotonic() - start)

        trickler = threading.Thread(target=trickle)
        trickler.start()
        silent = threading.Thread(target=attacker.silent, args=(d.address, 3.0, 50))
        silent.start()
        try:
            joins = [legit_join(d.address, CONTROL, device) for device in range(3)]
        finally:
            silent.join()
            stop.set()
            trickler.join()
        wait_for(lambda: len(admitted) == 3)  # the door hands a peer on just after welcoming it
        # handshakes run on their own threads, so a peer may be handed on after the next one's welcome
        assert sorted(admitted) == [0, 1, 2] and max(joins) < ADMITTED_AT_ONCE_S, joins
        assert hung_up and hung_up[0] < 10, "the trickler was never cut off"
        assert d.turned_away >= 50 - 4  # one address has at most waiting_per_source connections on the porch
        assert not d._in_flight  # no stranger ever held a handshake's place
        print(f"\nlegit handshakes under attack: {', '.join(f'{t * 1e3:.0f} ms' for t in joins)}; "
              f"trickler cut off after {hung_up[0]:.2f} s (knock deadline 1.5 s); turned away {d.turned_away}")


def test_strangers_from_many_addresses_fill_the_porch_and_a_member_walks_past_them():
    """Every place on the porch taken by silent strangers from 16 addresses: a member's knock still gets it
    in, and the strangers never reach the handshake."""
    with door(DoorLimits(knock_deadline_s=60, waiting=8, waiting_per_source=8)) as (d, admitted):
        with ExitStack() as flood:
            for i in range(16):
                flood.enter_context(connect_from(d.address, stranger(i)))
            wait_for(lambda: d.turned_away == 8 and len(d._porch) == 8, what="a full porch")
            assert legit_join(d.address, CONTROL, 5) < ADMITTED_AT_ONCE_S
            wait_for(lambda: admitted != [])  # handed on just after the welcome the peer saw
            assert not d._in_flight and d.refused == 0
        assert admitted == [5]


def test_handshakes_held_one_to_an_address_in_every_place_never_shut_a_member_out():
    """Knocks copied to a door from as many addresses as it has places (each one fresh there), each handshake
    then left silent: a member from another address takes the place of one of them."""
    with door(DoorLimits(deadline_s=60, in_flight=4, per_source=2)) as (d, admitted):
        with ExitStack() as holders:
            for i in range(4):
                sock = holders.enter_context(connect_from(d.address, stranger(i)))
                sock.sendall(knock_frame(SECRET, CONTROL))
                assert set(answer_of(sock)) == {"type", "nonce"}  # a challenge: the place is taken
            wait_for(lambda: len(d._in_flight) == 4, what="every place taken")
            assert legit_join(d.address, CONTROL, 5) < ADMITTED_AT_ONCE_S
            wait_for(lambda: admitted != [])
        assert admitted == [5]


def test_a_replayed_knock_is_refused_and_a_knock_opens_only_its_purposes_door():
    knock = knock_frame(SECRET, CONTROL)
    with door() as (d, admitted):
        for attempt in range(2):
            with connect_from(d.address, stranger(attempt)) as sock:
                sock.sendall(knock)  # a copy of a member's knock, the second time a replay
                reply = answer_of(sock)
            assert (set(reply) == {"type", "nonce"}) if attempt == 0 else (reply == "closed"), reply
        wait_for(lambda: d.refused == 2, what="the unanswered challenge and the replay refused")
        with connect_from(d.address, stranger(3)) as sock:
            sock.sendall(knock_frame(SECRET, HEARTBEAT))
            assert answer_of(sock) == "closed"
        wait_for(lambda: d.refused == 3)
        with connect_from(d.address, stranger(4)) as sock:
            sock.sendall(knock_frame(b"another home's secret, 32 bytes", CONTROL))
            assert answer_of(sock) == {"type": "rejected"}  # a member set up wrong is told so
    assert admitted == []


@pytest.mark.parametrize("kind", ["control", "heartbeat", "data"])
def test_malformed_hellos_are_one_log_line_each_and_no_thread_dies(kind, caplog, monkeypatch):
    """Each port of a pipeline: every malformed hello is refused, logged once, and nothing dies: a stranger's
    on the porch, and one sent after a right knock, by the hello's parser."""
    died: list[object] = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    threads_before = threading.active_count()
    with ExitStack() as stack:
        if kind == "control":
            arrivals = Arrivals(LEGIT, 0, SECRET)
            stack.callback(arrivals.close)
            address, purpose, door_of = arrivals.address, CONTROL, arrivals.door
        elif kind == "heartbeat":
            monitor = stack.enter_context(HeartbeatMonitor(SECRET, [9], LivenessSettings()))
            address, purpose, door_of = monitor.address, HEARTBEAT, monitor._door
        else:
            listener = stack.enter_context(DataListener(LEGIT, SECRET))
            address, purpose, door_of = listener.address, data_purpose(999, 0), listener._door
        serving = threading.active_count()
        attacker = Attacker()
        with caplog.at_level(logging.WARNING, logger="ecofl.net.door"):
            answers = attacker.malformed(address)  # strangers: refused on the porch
            wait_for(lambda: door_of.refused == len(MALFORMED))
            answers.update({f"{what}, knocked": answer
                            for what, answer in attacker.malformed(address, knock_for=purpose).items()})
            wait_for(lambda: door_of.refused == 2 * len(MALFORMED))  # members: refused by the hello's parser
        assert set(answers.values()) == {"closed"}, answers  # no answer to a malformed hello, not even "rejected"
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == len(answers), lines  # one line per source
        assert all("refused" in line for line in lines)
        wait_for(lambda: threading.active_count() == serving)  # the handshake threads ended, none else
        assert legit_join(address, purpose) < ADMITTED_AT_ONCE_S
        if kind == "heartbeat":
            assert monitor._thread.is_alive()
    assert not died
    wait_for(lambda: threading.active_count() == threads_before)
    print(f"\n{kind}: threads {threads_before} before, {serving} serving, {threading.active_count()} after; "
          + "; ".join(lines[:3]))


DOOR_AT_THE_FILE_LIMIT = """
import logging, resource, sys
from ecofl.net.door import Door, DoorLimits
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (48, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
def take(peer):
    print("admitted", peer.device, flush=True)
    peer.channel.close()
unbounded = DoorLimits(deadline_s=120, in_flight=10_000, per_source=10_000)  # only the file limit stops it
with Door("127.0.0.1", 0, bytes(range(32)), lambda p: p == "control", take, name="test", limits=unbounded) as door:
    print(door.address[1], flush=True)
    sys.stdin.readline()
"""


def test_a_door_at_the_open_file_limit_pauses_says_so_once_and_goes_on():
    """A door without bounds on handshakes, at 48 open files: a flood of peers that knock right and then stall
    (only members get that far: a member's bug) meets EMFILE; afterwards a peer gets in at once."""
    child = subprocess.Popen([sys.executable, "-c", DOOR_AT_THE_FILE_LIMIT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    log: list[str] = []
    reader = threading.Thread(target=lambda: log.extend(child.stderr), daemon=True)
    reader.start()
    try:
        address = (LEGIT, int(child.stdout.readline()))
        flood = ExitStack()
        with flood:
            for i in range(150):
                try:
                    flood.enter_context(connect_from(address, stranger(i % 10), timeout=0.5)).sendall(
                        knock_frame(SECRET, CONTROL))
                except OSError:
                    pass  # the listener's backlog is full too
            time.sleep(1.0)
        admitted_after = legit_join(address, CONTROL, 3)
        assert admitted_after < ADMITTED_AT_ONCE_S
        assert child.stdout.readline().strip() == "admitted 3"
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        reader.join(timeout=10)
        child.stdout.close(), child.stdin.close()
    text = "".join(log)
    assert text.count("pauses accepting: Too many open files") == 1, text[-2000:]
    assert "accepts again" in text and "Traceback" not in text
    print(f"\nafter the flood at 48 open files a peer was admitted in {admitted_after * 1e3:.0f} ms; door log:\n"
          + "\n".join(line for line in text.splitlines() if "pauses" in line or "again" in line))


def test_an_idle_door_sleeps_until_a_peer_knocks_or_it_is_closed():
    """Every wake-up of the accepting thread costs a confined device CPU: idle, it does not poll its stop (and
    closing still ends it)."""
    with door() as (d, _):
        woke = []
        select = d._selector.select
        d._selector.select = lambda timeout=None: woke.append(timeout) or select(timeout)
        time.sleep(3)
        idle = len(woke)
        d.close()
        assert not d._thread.is_alive()  # closing ended it
    assert idle <= 4, woke  # a second between wake-ups while nobody knocks (it polled every 0.1 s)


def test_an_accept_loop_that_cannot_go_on_says_why(caplog):
    with caplog.at_level(logging.ERROR, logger="ecofl.net.door"), door() as (d, _):
        d._listener.close()  # what no door does to itself: the port gone from under it
        wait_for(lambda: d.stopped is not None)
    assert d.stopped.startswith("accepting failed")
    assert [r.getMessage() for r in caplog.records if "stops accepting" in r.getMessage()]


# -- a home training under attack --------------------------------------------------------------


def train_while(attack, devices: int = 3, network=None) -> None:
    """Rounds of 10 sync-rounds (3 devices, fault tolerance on) until ``attack(ports, detection_bound_s)``, on a
    thread, is over: every sync-round completes, none is lost, no device is declared failed."""
    from ecofl.pipeline.runtime import HomePipeline
    from ecofl.pipeline.runtime.faults import FaultTolerance
    from pipeline_kit import FAST_HEARTBEAT, PROFILE, THREE_STAGES, WITHOUT_BATCH_NORM, data

    x, y = data()
    admissions: list[dict] = []
    failed: list[BaseException] = []
    results = []
    with HomePipeline(WITHOUT_BATCH_NORM, pool(devices), THREE_STAGES, profile=PROFILE, emulate="none",
                      timeout_s=60, secret=SECRET, network=network,
                      fault_tolerance=FaultTolerance(heartbeat=FAST_HEARTBEAT)) as home:
        control = home.control
        ports = {"control": (control.address, CONTROL), "heartbeat": (control.monitor.address, HEARTBEAT)}
        ports.update({f"data {d}": (address, data_purpose(999, 0)) for d, address in home.data_ports.items()})

        def run() -> None:
            try:
                admissions.extend(attack(ports, FAST_HEARTBEAT.detection_bound_s))
            except BaseException as error:  # noqa: BLE001 - reported by the test
                failed.append(error)

        attacker = threading.Thread(target=run)
        started = time.monotonic()
        attacker.start()
        try:
            while attacker.is_alive() or not results:
                results.append(home.train(None, x, y, 10, lr=0.1))
        finally:
            attacker.join()
        failures = control.monitor.failures()
        refused = control.arrivals.door.refused
    assert not failed, failed
    assert all(r.rounds_completed == 10 and not r.events and r.lost_rounds == 0 for r in results)
    assert failures == {}
    assert refused >= len(MALFORMED)
    slow = [a for a in admissions if max(a["during_s"], a["after_s"]) > ADMITTED_AT_ONCE_S]
    assert len(admissions) == 5 * len(ports) and not slow, slow  # every attack on every port, every peer at once
    print(f"\n{len(results)} x 10 sync-rounds in {time.monotonic() - started:.0f} s under attack, none lost; "
          + "; ".join(f"{a['port']}, {a['attack']}: admitted in {a['during_s'] * 1e3:.0f} ms during, "
                      f"{a['after_s'] * 1e3:.0f} ms after" for a in admissions))


@pytest.mark.slow
def test_a_home_trains_every_sync_round_while_a_stranger_attacks_every_port():
    """Loopback: every attack at every port (control, heartbeat, each worker's data port) in turn; at the
    heartbeat port for longer than it takes to declare a device failed (what a blocked monitor once did)."""
    train_while(lambda ports, detection_s: attack_every_port(ports, detection_s + 1, 1.0, Attacker()))


ATTACK_FROM_A_NAMESPACE = """
import json, sys
from attacker import Attacker, attack_every_port
ports = {name: (tuple(address), purpose) for name, (address, purpose) in json.loads(sys.argv[1]).items()}
print(json.dumps(attack_every_port(ports, float(sys.argv[2]), float(sys.argv[3]), Attacker(only_from=sys.argv[4]),
                                   legit_from=sys.argv[5])))
"""


@pytest.mark.slow
@pytest.mark.skipif(NETNS is not None, reason=str(NETNS))
def test_a_home_on_its_own_network_trains_while_a_stranger_on_that_network_attacks_every_port():
    """Network namespaces: the workers on their devices' addresses, the attacker at one more address of the
    home network (a fourth device's namespace, not in the plan), and a peer with the secret at another. A
    second each (how long a blocked monitor takes to fail a device is the loopback test's matter)."""
    with HomeNetwork(pool(4), [0, 1, 2, 3]) as network:
        legit = str(network.subnet[200])
        subprocess.run([*network.prefix(3), "ip", "addr", "add", f"{legit}/24", "dev", "eth0"], check=True)

        def attack(ports, _detection_s: float) -> list[str]:
            done = subprocess.run(
                [*network.prefix(3), sys.executable, "-c", ATTACK_FROM_A_NAMESPACE, json.dumps(ports), "1", "1",
                 network.address(3), legit],
                capture_output=True, text=True, timeout=240, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
            assert done.returncode == 0, done.stderr[-3000:]
            return json.loads(done.stdout.splitlines()[-1])

        train_while(attack, devices=4, network=network)


# -- the home service ----------------------------------------------------------------------------


@contextmanager
def home_service(tmp_path: Path, open_files: int):
    """``ecofl home serve`` at a soft limit of ``open_files`` (as a service manager may give it): its address
    and log."""
    import resource

    secret_file, port_file, log = tmp_path / "secret", tmp_path / "port", tmp_path / "home.log"
    secret_file.write_text(SECRET.hex())
    secret_file.chmod(0o600)
    limit = lambda: resource.setrlimit(resource.RLIMIT_NOFILE,  # noqa: E731
                                       (open_files, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    with open(log, "w") as out:
        service = subprocess.Popen(
            [sys.executable, "-m", "ecofl", "home", "serve", "--listen", f"{LEGIT}:0", "--name", "attacked",
             "--secret-file", str(secret_file), "--port-file", str(port_file)],
            stdout=out, stderr=subprocess.STDOUT, preexec_fn=limit, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: port_file.exists() and port_file.read_text().strip() or service.poll() is not None, 180)
        assert service.poll() is None, log.read_text()[-2000:]
        yield (LEGIT, int(port_file.read_text())), log, service.pid
    finally:
        service.terminate()
        try:
            service.wait(timeout=30)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()


class FakeDaemon:
    """A registered device that beats every half second (a device daemon's part of the protocol, no workers)."""

    def __init__(self, address: tuple[str, int]):
        self.sock = dial(address, SECRET, 0, DAEMON)
        send_message(self.sock, encode(describe_device("beating", "nano-10w", 100.0)))
        assert recv_message(self.sock)[0]["type"] == "registered"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._beat)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(0.5):
            send_message(self.sock, encode(DaemonBeat(0)))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def test_a_home_service_at_256_open_files_answers_at_once_after_a_flood_of_1000(tmp_path):
    """At `ulimit -n 256`: malformed hellos (one log line each), then 1,000 trickling connections from 100
    addresses; a registered device stays present throughout and `ecofl home status` answers at once after."""
    with home_service(tmp_path, 256) as (address, log, _):
        daemon = FakeDaemon(address)
        try:
            answers = Attacker(1).malformed(address)
            Attacker(100).trickle(address, 3.0, connections=1000, sources=100)
            start = time.monotonic()
            status = home_status(address, SECRET)
            answered_s = time.monotonic() - start
            (tmp_path / "secret").chmod(0o600)
            start = time.monotonic()
            cli = subprocess.run([sys.executable, "-m", "ecofl", "home", "status", "--home", f"{LEGIT}:{address[1]}",
                                  "--secret-file", str(tmp_path / "secret"), "--json"], capture_output=True,
                                 text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
            cli_s = time.monotonic() - start
        finally:
            daemon.close()
        text = log.read_text()
    assert set(answers.values()) == {"closed"}, answers
    assert answered_s < 10, answered_s  # the issue asks for 2 s (figure printed); it once never answered again
    assert cli.returncode == 0 and json.loads(cli.stdout)["devices"] == status["devices"], cli.stderr[-2000:]
    assert [d["name"] for d in status["devices"]] == ["beating"]  # its beats were read all along
    assert status["refused"] >= len(MALFORMED)
    for n in range(1, 1 + len(MALFORMED)):
        assert text.count(f"{stranger(n)} refused") == 1, text[-3000:]  # one line per source
    assert "Traceback" not in text, text[-3000:]
    print(f"\nafter the flood: status answered in {answered_s * 1e3:.0f} ms (the CLI, with its imports, in "
          f"{cli_s:.1f} s); {status['refused']} refused; log lines: {len(text.splitlines())}")


def open_files_and_threads(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/fd")), len(os.listdir(f"/proc/{pid}/task"))


@pytest.mark.slow
def test_a_home_service_answers_status_while_300_addresses_attack_and_comes_back_to_its_baseline(tmp_path):
    """300 silent connections, then 300 reconnecting tricklers, each from an address of its own (issue 44:
    the many-address attack that once refused `home status` for the 10 s of every stranger's handshake).
    Status is asked 3, 8 and 12 s into each attack; the service's open files and threads come back to what
    they were before."""
    probes_s = (3.0, 8.0, 12.0)
    answered: dict[str, list[float]] = {}
    with home_service(tmp_path, 1024) as (address, log, pid):
        home_status(address, SECRET)
        baseline = open_files_and_threads(pid)  # the status session's thread may be ending: at most this after
        attacker = Attacker(first_source=1)
        attacks = {
            "300 silent": lambda: attacker.silent(address, probes_s[-1] + 1, connections=300, sources=300),
            "300 reconnecting tricklers": lambda: attacker.trickle(address, probes_s[-1] + 1, connections=300,
                                                                   sources=300, reconnect=True),
        }
        for name, attack in attacks.items():
            attacking = threading.Thread(target=attack)
            started = time.monotonic()
            attacking.start()
            try:
                for at in probes_s:
                    time.sleep(max(0.0, started + at - time.monotonic()))
                    asked = time.monotonic()
                    status = home_status(address, SECRET)  # refused (ChannelClosed) before the knock
                    answered.setdefault(name, []).append(time.monotonic() - asked)
                    assert status["name"] == "attacked"
            finally:
                attacking.join()
        try:
            wait_for(lambda: all(now <= before for now, before in zip(open_files_and_threads(pid), baseline)),
                     timeout_s=60)
        except AssertionError:
            raise AssertionError(f"open files and threads {open_files_and_threads(pid)} a minute after the attacks, "
                                 f"{baseline} before; status answered in {answered}") from None
        text = log.read_text()
    slowest = max(max(times) for times in answered.values())
    assert slowest < ADMITTED_AT_ONCE_S, answered  # the issue asks for 2 s (figures printed): well under 10 s
    assert "Traceback" not in text, text[-3000:]
    print("\nstatus answered in " + "; ".join(f"{name}: " + ", ".join(f"{t * 1e3:.0f} ms" for t in times)
                                             for name, times in answered.items())
          + f" (at {', '.join(f'{p:g}' for p in probes_s)} s into each); open files and threads back to {baseline}")
