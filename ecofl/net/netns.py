"""Real links for emulated devices: network namespaces, veth pairs and ``tc tbf`` (root only).

Each device's worker runs in its own network namespace whose only interface,
``eth0``, is one end of a veth pair; the other ends meet on a bridge in a hub
namespace, which one more veth pair joins to the portal in the host's
namespace. Each device's link is shaped in both directions with a token
bucket filter at the device's ``bandwidth_bps`` (``tc tbf`` on its ``eth0``
for what it sends, on the hub's end for what it receives), so the path from
device i to j runs at min(bw_i, bw_j): the pool's default bandwidth matrix
(:class:`ecofl.devices.HomePool`). The kernel shapes real TCP traffic; this
kernel has no netem, so there is no added delay. Everything is removed on
exit, also on failure.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess

from ecofl.devices import HomePool


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here, or None if they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    name = f"ecofl-probe-{secrets.token_hex(3)}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


class HomeNetwork:
    """The namespaces and shaped links of one home's devices; a context manager."""

    def __init__(self, pool: HomePool, devices: list[int]):
        self.pool, self.devices = pool, list(devices)
        self.tag = secrets.token_hex(2)
        self.hub = f"ecofl-{self.tag}-hub"
        self.uplink = f"ecofl{self.tag}"  # the portal's interface in the host namespace
        self.subnet = _free_subnet()
        self.portal_address = str(self.subnet[1])
        self._created: list[str] = []

    def namespace(self, device: int) -> str:
        return f"ecofl-{self.tag}-d{device}"

    def address(self, device: int) -> str:
        """The IPv4 address of ``device``'s ``eth0``."""
        return str(self.subnet[10 + self.devices.index(device)])

    def prefix(self, device: int) -> list[str]:
        """Command prefix that runs a program inside ``device``'s namespace."""
        return ["ip", "netns", "exec", self.namespace(device)]

    def __enter__(self) -> "HomeNetwork":
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _build(self) -> None:
        prefix = self.subnet.prefixlen
        self._netns_add(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        _ip("link", "add", self.uplink, "type", "veth", "peer", "name", "portal", "netns", self.hub)
        self._created.append(self.uplink)
        _ip("addr", "add", f"{self.portal_address}/{prefix}", "dev", self.uplink)
        _ip("link", "set", self.uplink, "up")
        _ip("-n", self.hub, "link", "set", "portal", "master", "br0", "up")
        for device in self.devices:
            ns = self.namespace(device)
            self._netns_add(ns)
            port = f"d{device}"
            _ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(device)}/{prefix}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            rate = self.pool.devices[device].bandwidth_bps
            _shape(ns, "eth0", rate)  # what the device sends
            _shape(self.hub, port, rate)  # what it receives

    def _netns_add(self, name: str) -> None:
        _run(["ip", "netns", "add", name])
        self._created.append(name)

    def close(self) -> None:
        """Delete the namespaces (their veth ends go with them) and the portal's interface."""
        for name in reversed(self._created):
            if name == self.uplink:
                subprocess.run(["ip", "link", "del", name], capture_output=True)
            else:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._created.clear()


def _shape(namespace: str, interface: str, rate_bps: float) -> None:
    """``tc tbf`` at ``rate_bps`` bytes/s on an interface's egress."""
    bits = max(8000, int(rate_bps * 8))
    burst = max(32 * 1024, int(rate_bps / 100))  # at least one timer tick's worth at HZ = 100
    _run(["tc", "-n", namespace, "qdisc", "add", "dev", interface, "root", "tbf",
          "rate", f"{bits}bit", "burst", str(burst), "latency", "200ms"])


def _free_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.213.0.0/16 that no interface of this host uses."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for third in [int.from_bytes(secrets.token_bytes(1), "big") for _ in range(64)]:
        subnet = ipaddress.ip_network(f"10.213.{third}.0/24")
        if f"10.213.{third}." not in used:
            return subnet
    raise RuntimeError("no free 10.213.x.0/24 subnet for the home network")


def _ip(*args: str) -> None:
    _run(["ip", *args])


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")
