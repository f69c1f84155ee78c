"""Run inside a testbed container by test_container_loopback.py: send a hand-made TCP SYN out of eth0 to the
gateway's MAC, addressed to DST:PORT whatever the IP route says; print what answers (synack, rst, none)."""

import os
import socket
import struct
import sys
import time


def checksum(data):
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def main(destination, port):
    routes = [line.split() for line in open("/proc/net/route").read().splitlines()[1:]]
    gateway = socket.inet_ntoa(struct.pack("<L", int([r for r in routes if r[1] == "00000000"][0][2], 16)))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a datagram to the gateway fills the ARP table
    udp.connect((gateway, 9))
    source = udp.getsockname()[0]
    udp.send(b"x")
    time.sleep(0.2)
    arp = [line.split() for line in open("/proc/net/arp").read().splitlines()[1:]]
    gateway_mac = [a[3] for a in arp if a[0] == gateway][0]
    own_mac = open("/sys/class/net/eth0/address").read().strip()
    try:
        raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    except PermissionError as error:
        print("no-raw-socket", error)
        return
    raw.bind(("eth0", 0))
    source_port = 40000 + os.getpid() % 20000
    tcp = struct.pack("!HHLLBBHHH", source_port, port, 1, 0, 5 << 4, 0x02, 64240, 0, 0)  # SYN
    pseudo = socket.inet_aton(source) + socket.inet_aton(destination) + struct.pack("!BBH", 0, 6, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, socket.inet_aton(source),
                     socket.inet_aton(destination))
    ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
    ethernet = bytes.fromhex(gateway_mac.replace(":", "")) + bytes.fromhex(own_mac.replace(":", "")) + b"\x08\x00"
    raw.send(ethernet + ip + tcp)
    raw.settimeout(0.2)
    deadline = time.time() + 3
    while time.time() < deadline:
        try:
            frame = raw.recv(2048)
        except TimeoutError:
            continue
        if len(frame) < 54 or frame[23] != 6:  # not TCP
            continue
        answer_from = socket.inet_ntoa(frame[26:30])
        if answer_from == destination and struct.unpack("!H", frame[36:38])[0] == source_port:
            flags = frame[47]
            print("synack" if flags & 0x12 == 0x12 else "rst" if flags & 0x04 else f"tcp-{flags:x}")
            return
    print("none")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
