"""SIGTERM unwinds as Ctrl-C: what a stopped command started is stopped and deleted (ecofl/interrupt.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ecofl.net.netns import unavailable_reason
from processes import fork_servers, worker_processes

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for whoever inherited it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sigterm_to_ecofl_home_train_stops_its_workers_and_says_so(tmp_path):
    command = [sys.executable, "-m", "ecofl.cli", "home", "train", "--model", "cnn", "--pool", "nano-10w,tx2-maxn",
               "--dataset", "digits", "--batch", "16", "--rounds", "100000", "--emulate", "sleep",
               "--cache-dir", str(tmp_path)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        workers: list[int] = []
        while len(workers) < 2 and time.time() < deadline and process.poll() is None:
            time.sleep(0.5)
            workers = worker_processes(process.pid)
        assert len(workers) == 2, f"the home's two workers never started (exit {process.poll()})"
        servers = fork_servers(process.pid)
        assert len(servers) == 1
        time.sleep(2)  # into its sync-rounds
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert "ecofl: interrupted (stopped by SIGTERM)" in stderr
    deadline = time.time() + 30
    while any(alive(pid) for pid in workers + servers) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers + servers)


NETWORK_SCRIPT = textwrap.dedent("""
    import time
    from ecofl.devices import DeviceSpec, HomePool
    from ecofl.interrupt import sigterm_as_interrupt
    from ecofl.net.netns import HomeNetwork

    pool = HomePool("t", tuple(DeviceSpec(f"dev{i}", 1.0, 1 << 30, 1e6) for i in range(2)))
    with sigterm_as_interrupt():
        with HomeNetwork(pool, [0, 1]) as network:
            print(network.hub, network.namespace(0), network.namespace(1), flush=True)
            time.sleep(600)
""")


@pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason()))
def test_sigterm_inside_a_shaped_home_network_deletes_its_namespaces():
    process = subprocess.Popen([sys.executable, "-c", NETWORK_SCRIPT], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        namespaces = process.stdout.readline().split()
        assert len(namespaces) == 3, process.stderr.read() if process.poll() is not None else "no namespaces"
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert all(ns in listed for ns in namespaces)
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0  # stopped, as by Ctrl-C
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in namespaces)


def test_a_deferred_clean_up_finishes_before_the_signals_sent_during_it_interrupt():
    """Two SIGTERMs inside ``interrupts_deferred`` (a clean-up removing cgroups and reaping workers) wait for the
    block to end, then interrupt: nothing the clean-up had left to remove is left behind. Another thread is
    running, as the fork server's reader is during a home's clean-up: the kernel may hand it the signals."""
    script = textwrap.dedent("""
        import os, signal, threading
        from ecofl.interrupt import interrupts_deferred, sigterm_as_interrupt
        threading.Thread(target=threading.Event().wait, daemon=True).start()
        with sigterm_as_interrupt():
            try:
                with interrupts_deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(10 ** 6):  # a Python-level handler would have run by now
                        pass
                    print("clean-up finished", flush=True)
            except KeyboardInterrupt:
                print("interrupted after it", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["clean-up finished", "interrupted after it"], out.stderr


def test_a_signal_during_an_interrupted_programs_exit_keeps_its_exit_status():
    """The ``ecofl`` program stopped once exits with 130 even when a second SIGTERM or Ctrl-C reaches it while the
    interpreter exits (reaping the fork server, after every clean-up): not as killed by the signal."""
    for signum in ("SIGTERM", "SIGINT"):
        script = textwrap.dedent(f"""
            import atexit, os, signal, time
            import ecofl.cli
            ecofl.cli.main = lambda: 130  # a run that was interrupted and has cleaned up
            atexit.register(lambda: (os.kill(os.getpid(), signal.{signum}), time.sleep(5), print("not ended")))
            ecofl.cli.run()
        """)
        out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 130 and "not ended" not in out.stdout and "Traceback" not in out.stderr, \
            (signum, out.returncode, out.stderr)
