#!/usr/bin/env python3
"""Recomputes the ICRC of every RoCEv2 frame in a pcap with scapy's own
RoCE layer (scapy.contrib.roce), and compares it with the ICRC on the wire.

A second opinion nobody on this project wrote: tshark shows the ICRC but
does not verify it.

Usage: scapy_icrc.py CAPTURE.pcap
Prints one JSON object: frames, matched, and the mismatched or undecodable
frames (1-based numbers). Exits 0 only if every frame is RoCEv2 and matches.
"""
import json
import sys

from scapy.contrib.roce import BTH
from scapy.utils import rdpcap


def main(path):
    packets = rdpcap(path)
    matched, mismatched, not_roce = 0, [], []
    for number, packet in enumerate(packets, start=1):
        if BTH not in packet:
            not_roce.append(number)
            continue
        wire = bytes(packet)[-4:]
        computed = packet[BTH].compute_icrc(None)
        if computed == wire:
            matched += 1
        else:
            mismatched.append({"frame": number, "wire": wire.hex(), "scapy": computed.hex()})
    report = {"frames": len(packets), "matched": matched, "mismatched": mismatched, "not_roce": not_roce}
    print(json.dumps(report))
    return 0 if len(packets) > 0 and matched == len(packets) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
