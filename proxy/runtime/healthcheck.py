"""The container's healthcheck: `python -m proxy.runtime.healthcheck [PID]` probes /healthz on
the port the proxy (PID 1 in the image) listens on, whichever it is: `--port`, `server.port` or
the default. The port is read from the kernel's socket tables (the LISTEN sockets among the
process's own descriptors), so nothing has to repeat it. Exit 0 healthy, 1 not."""

from __future__ import annotations

import os
import socket
import sys
import urllib.request
from pathlib import Path

LISTEN = "0A"  # the TCP state in /proc/net/tcp


def listening_ports(pid: int) -> list[tuple[str, int]]:
    """(address to probe, port) of every TCP socket `pid` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for row in path.read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != LISTEN or fields[9] not in inodes:
                continue
            address, port = fields[1].split(":")
            found.append((_probe_address(address, family), int(port, 16)))
    return found


def _probe_address(hex_address: str, family: socket.AddressFamily) -> str:
    raw = bytes.fromhex(hex_address)
    # /proc writes each 32-bit word in host order (little-endian here).
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    if not any(packed):  # every address: loopback answers
        return "127.0.0.1" if family == socket.AF_INET else "[::1]"
    shown = socket.inet_ntop(family, packed)
    return shown if family == socket.AF_INET else f"[{shown}]"


def main(argv: list[str]) -> int:
    pid = int(argv[0]) if argv else 1
    ports = listening_ports(pid)
    if not ports:
        print(f"process {pid} listens on no TCP port", file=sys.stderr)
        return 1
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    for address, port in ports:
        try:
            with direct.open(f"http://{address}:{port}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    return 0
        except OSError as exc:
            print(f"{address}:{port}: {exc}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
