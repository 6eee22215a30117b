"""Minimal child-side library for ndd external modules (pipe placement).

Protocol: docs/external-modules.md. Every message is u32 BE length, u8 type, body.
For each request, write zero or more replies, then DONE.
"""
import struct
import sys

FRAME, CONTROL, TIMEOUT, FLUSH = 0x02, 0x03, 0x04, 0x05
OUT_FRAME, DONE, ERROR = 0x81, 0x83, 0x84
NO_WAKE = 0xFFFFFFFFFFFFFFFF
META = struct.Struct(">HQQH")  # stream, seq, timestamp_ns, flags


def _read_exact(f, n):
    buf = b""
    while len(buf) < n:
        chunk = f.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def serve(transform):
    """Calls transform(payload) -> payload for every frame; answers everything else with DONE."""
    rd, wr = sys.stdin.buffer, sys.stdout.buffer
    while True:
        head = _read_exact(rd, 4)
        if head is None:
            return  # host closed the channel
        (n,) = struct.unpack(">I", head)
        msg = _read_exact(rd, n)
        if msg is None:
            return
        out = b""
        if msg[0] == FRAME:
            meta = msg[9:29]  # after type (1) and now_ns (8)
            payload = transform(msg[29:])
            out += struct.pack(">IB", 1 + len(meta) + len(payload), OUT_FRAME) + meta + payload
        elif msg[0] == CONTROL:
            text = b"no control messages"
            wr.write(struct.pack(">IB", 1 + len(text), ERROR) + text)
            wr.flush()
            continue
        out += struct.pack(">IBQ", 9, DONE, NO_WAKE)
        wr.write(out)
        wr.flush()
