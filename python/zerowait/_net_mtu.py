"""The path-MTU probe of ``zerowait bench net``: where each rank's traffic goes (address,
interface, MTU), a UDP ack server, the don't-fragment binary search between rank 0 and every
other rank, and the verdict and fix for each direction (bench_net.py's docstring has the method
and the JSON shape)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

_HEADERS = 28  # IPv4 (20) + UDP (8) bytes around a datagram's payload
_MIN_PAYLOAD = 576 - _HEADERS  # every IPv4 path carries 576-byte packets
_TRIES = 3
_IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)  # <linux/in.h>
_IP_PMTUDISC_PROBE = getattr(socket, "IP_PMTUDISC_PROBE", 3)
_SIOCGIFADDR = 0x8915
_PROBE_MAGIC = b"ZWMP"
_ACK = struct.Struct("!4sQI")  # magic, token, payload bytes received


# ---------------------------------------------------------------------------------------------
# Where a rank's traffic goes: address, interface, MTU


@dataclass
class Endpoint:
    rank: int
    ip: Optional[str]
    interface: Optional[str]
    mtu: Optional[int]
    host: str = ""  # boot id + network namespace: equal for ranks that share a network stack

    def describe(self) -> str:
        return f"rank {self.rank} ({self.ip}, {self.interface}, MTU {self.mtu})"

    def public(self) -> Dict[str, Any]:
        return {"rank": self.rank, "ip": self.ip, "interface": self.interface, "mtu": self.mtu}


def host_key() -> str:
    """Two processes with the same key share one network stack (loopback reaches both)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = socket.gethostname()
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        netns = 0
    return f"{boot}/{netns}"


def route_source(ip: str) -> str:
    """The local address the kernel sends from to reach `ip` (connect() on UDP sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        return s.getsockname()[0]


@functools.lru_cache(maxsize=1)  # rank 0 asks once per peer; the answer does not change
def interface_addresses() -> Dict[str, str]:
    """IPv4 address -> interface name: `ip -j addr` (every address), else SIOCGIFADDR (the
    primary address of each interface in /sys/class/net)."""
    if shutil.which("ip"):
        try:
            out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True,
                                 text=True, timeout=10, check=True).stdout
            return {a["local"]: link["ifname"] for link in json.loads(out)
                    for a in link.get("addr_info", []) if a.get("family") == "inet"}
        except (OSError, subprocess.SubprocessError, ValueError, KeyError):
            pass  # an old iproute2 without -j: ask the kernel directly
    found: Dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in sorted(os.listdir("/sys/class/net")):
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue  # no IPv4 address
            found[socket.inet_ntoa(raw[20:24])] = name
    return found


def interface_mtu(name: Optional[str]) -> Optional[int]:
    if name is None:
        return None
    try:
        return int(Path(f"/sys/class/net/{name}/mtu").read_text())
    except (OSError, ValueError):
        return None


def endpoint_toward(rank: int, peer_ip: Optional[str]) -> Endpoint:
    """This rank's address, interface and MTU on the route to `peer_ip`."""
    try:
        ip = route_source(peer_ip) if peer_ip else None
    except OSError:  # no route: the probe reports it rather than failing this rank
        ip = None
    if ip is None:
        return Endpoint(rank, None, None, None, host_key())
    interface = interface_addresses().get(ip)
    if interface is None and ip.startswith("127."):
        interface = "lo"
    return Endpoint(rank, ip, interface, interface_mtu(interface), host_key())


# ---------------------------------------------------------------------------------------------
# Path MTU probe


class AckServer:
    """Answers each probe datagram with a small ack naming its token and length, so only the
    direction towards this server carries large datagrams. Serves from a thread until close()."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.settimeout(0.05)  # how soon close() is noticed
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="zerowait-mtu-ack")
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                data, peer = self._sock.recvfrom(65536)
            except OSError:  # timeout, or an ICMP error from an earlier ack
                continue
            if len(data) >= 12 and data[:4] == _PROBE_MAGIC:
                with contextlib.suppress(OSError):
                    self._sock.sendto(_ACK.pack(_PROBE_MAGIC, int.from_bytes(data[4:12], "big"),
                                                len(data)), peer)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sock.close()


def probe_path(ip: str, port: int, local_mtu: int) -> Dict[str, Any]:
    """The largest UDP payload that reaches `ip`:`port` with the don't-fragment bit set.
    Returns {"largest_payload": int | None, "status": "unreachable" | "measured"}."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        # PROBE: set DF and send up to the interface MTU even when the kernel has cached a
        # smaller path MTU for this destination (DO would refuse with EMSGSIZE).
        sock.setsockopt(socket.IPPROTO_IP, _IP_MTU_DISCOVER, _IP_PMTUDISC_PROBE)
        sock.connect((ip, port))
        token = 0

        def arrives(payload: int, timeout: float) -> bool:
            nonlocal token
            for _ in range(_TRIES):
                token += 1
                try:
                    sock.send(_PROBE_MAGIC + token.to_bytes(8, "big") + bytes(payload - 12))
                except OSError as e:
                    if e.errno == errno.EMSGSIZE:
                        return False  # larger than the local interface takes
                    continue  # an ICMP error reported late (port unreachable): try again
                deadline = time.monotonic() + timeout
                while (left := deadline - time.monotonic()) > 0:
                    sock.settimeout(left)
                    try:
                        magic, got, length = _ACK.unpack(sock.recv(64)[:_ACK.size])
                    except (OSError, struct.error):
                        break
                    if magic == _PROBE_MAGIC and got == token and length == payload:
                        return True
            return False

        high = local_mtu - _HEADERS
        low = min(_MIN_PAYLOAD, high)
        start = time.monotonic()
        if not arrives(low, 1.0):
            return {"largest_payload": None, "status": "unreachable"}
        # A lost datagram costs a timeout: make it a generous multiple of the round trip.
        timeout = min(1.0, max(0.05, 20 * (time.monotonic() - start)))
        if arrives(high, timeout):
            return {"largest_payload": high, "status": "measured"}
        good, bad = low, high
        while bad - good > 1:
            middle = (good + bad) // 2
            if arrives(middle, timeout):
                good = middle
            else:
                bad = middle
        return {"largest_payload": good, "status": "measured"}


def safe_probe(ip: Optional[str], port: int, local_mtu: Optional[int]) -> Dict[str, Any]:
    """probe_path, with every failure turned into a result: a rank must reach the next
    collective whatever happened, or its peers wait for the timeout."""
    if ip is None or local_mtu is None:
        return {"largest_payload": None, "status": "error", "message":
                "no route to the peer" if ip is None else
                "the local interface's MTU is unknown (/sys/class/net unreadable)"}
    try:
        return probe_path(ip, port, local_mtu)
    except OSError as e:
        return {"largest_payload": None, "status": "error", "message": f"probe failed: {e}"}


def judge_direction(src: Endpoint, dst: Endpoint, probe: Dict[str, Any],
                    port: Optional[int]) -> Dict[str, Any]:
    """One direction's verdict and, for a mismatch, the message that names it and the fix."""
    out: Dict[str, Any] = {"from": src.rank, "to": dst.rank, "status": probe["status"],
                           "largest_payload": probe["largest_payload"], "path_mtu": None}
    head = f"{src.describe()} -> {dst.describe()}"
    if probe["status"] == "unreachable":
        out["message"] = (f"{head}: no {_MIN_PAYLOAD}-byte UDP datagram arrived at port "
                          f"{port}; a firewall may drop UDP between them (MTU not measured)")
        return out
    if probe["status"] != "measured":
        out["message"] = f"{head}: {probe.get('message', 'not measured')}"
        return out
    if src.mtu is None or dst.mtu is None:
        out.update(status="error", message=f"{head}: an interface's MTU is unknown")
        return out
    # veth and many NICs take a few bytes past their MTU (room for a VLAN tag); what the
    # receiver's MTU promises is the limit to plan for.
    path = min(probe["largest_payload"] + _HEADERS, dst.mtu)
    payload = path - _HEADERS
    out["path_mtu"] = path
    if path >= src.mtu and src.mtu == dst.mtu:
        out["status"] = "ok"
        return out
    out["status"] = "mismatch"
    lost = f"datagrams above {payload} bytes are lost" if path < src.mtu else (
        f"the MTUs differ (the path carries {path})")
    if path < min(src.mtu, dst.mtu):
        fix = (f"a hop between them carries at most {path} bytes: set MTU {path} on both ends "
               f"(ip link set dev {src.interface} mtu {path} on rank {src.rank}, ip link set dev "
               f"{dst.interface} mtu {path} on rank {dst.rank}) or raise the MTU along the path")
    else:
        big = src if src.mtu > dst.mtu else dst
        fix = (f"set the same MTU on both ends (ip link set dev {big.interface} mtu "
               f"{min(src.mtu, dst.mtu)})")
    out["message"] = f"{head}: {lost}; {fix}"
    return out


def probe_mtu(rank: int, world: int, endpoints: List[Endpoint], master_ip: str,
              control: Any) -> Dict[str, Any]:
    """Both directions between rank 0 and every other rank. Every rank calls this; the
    collectives sequence the servers and the probes, and bound every wait by the timeout."""
    import torch.distributed as dist

    remote = [r for r in range(1, world) if endpoints[r].host != endpoints[0].host]
    # Rank 0's end of each pair: the address it sends from towards that peer.
    near = {r: endpoint_toward(0, endpoints[r].ip) for r in remote} if rank == 0 else {}

    # Peers -> rank 0: rank 0 serves, peers probe MASTER_ADDR.
    server = AckServer() if rank == 0 and remote else None
    try:
        ports = [server.port if server else None]
        dist.broadcast_object_list(ports, src=0, group=control)
        mine = None
        if rank in remote:
            mine = safe_probe(master_ip, ports[0], endpoints[rank].mtu)
        inbound: List[Any] = [None] * world
        dist.all_gather_object(inbound, mine, group=control)
    finally:
        if server:
            server.close()

    # Rank 0 -> peers: each peer serves, rank 0 probes them all at once.
    server = AckServer() if rank in remote else None
    try:
        peer_ports: List[Any] = [None] * world
        dist.all_gather_object(peer_ports, server.port if server else None, group=control)
        outbound: Dict[int, Dict[str, Any]] = {}
        if rank == 0 and remote:
            with ThreadPoolExecutor(max_workers=min(16, len(remote))) as pool:
                futures = {r: pool.submit(safe_probe, endpoints[r].ip, peer_ports[r],
                                          near[r].mtu) for r in remote}
                outbound = {r: f.result() for r, f in futures.items()}
        dist.barrier(group=control)  # the servers stay up until rank 0 is done
    finally:
        if server:
            server.close()

    pairs = []
    for r in range(1, world):
        if r not in remote:
            pairs.append({"ranks": [0, r], "status": "same host",
                          "ends": [endpoints[0].public(), endpoints[r].public()],
                          "message": f"rank 0 <-> rank {r}: same host, not probed",
                          "directions": []})
            continue
        if rank != 0:
            continue
        zero, peer = near[r], endpoints[r]
        directions = [judge_direction(zero, peer, outbound[r], peer_ports[r]),
                      judge_direction(peer, zero, inbound[r], ports[0])]
        statuses = {d["status"] for d in directions}
        status = ("mismatch" if "mismatch" in statuses else
                  "ok" if statuses == {"ok"} else "failed")
        pairs.append({"ranks": [0, r], "status": status, "ends": [zero.public(), peer.public()],
                      "directions": directions})
    mismatches = [d["message"] for p in pairs for d in p["directions"]
                  if d["status"] == "mismatch"]
    return {"pairs": pairs, "mismatches": mismatches}
