#!/usr/bin/python3
"""An RFC 2217 server (pyserial's own PortManager, as in pyserial's rfc2217_server example)
whose port is pyserial's loop:// device: what a client writes comes back, CTS follows RTS and
DSR follows DTR. A stand-in for ser2net when no serial hardware is around, used by ndd's
RFC 2217 tests and handy for trying `rfc2217-client` by hand.

    python3 scripts/rfc2217-loop-server.py 127.0.0.1:2217

Prints one line per client and whenever the port's settings, DTR/RTS or break change:
    settings 57600 8 E 1 rtscts=False xonxoff=False dtr=True rts=False break=False
and one line per purge the client asks for (`purge input`, `purge output`).
"""

import socket
import sys
import threading
import time

import serial
import serial.rfc2217


def state(port):
    return "settings {} {} {} {} rtscts={} xonxoff={} dtr={} rts={} break={}".format(
        port.baudrate, port.bytesize, port.parity, port.stopbits,
        port.rtscts, port.xonxoff, port.dtr, port.rts, port.break_condition)


def serve(client, port):
    class Conn:
        lock = threading.Lock()

        def write(self, data):
            with self.lock:
                client.sendall(data)

    conn = Conn()
    manager = serial.rfc2217.PortManager(port, conn)
    alive = [True]

    def port_to_client():
        last = None
        while alive[0]:
            data = port.read(port.in_waiting or 1)
            if data:
                conn.write(b"".join(manager.escape(data)))
            manager.check_modem_lines()
            now = state(port)
            if now != last:
                print(now, flush=True)
                last = now

    reader = threading.Thread(target=port_to_client, daemon=True)
    reader.start()
    try:
        while True:
            data = client.recv(4096)
            if not data:
                break
            out = b"".join(manager.filter(data))
            if out:
                port.write(out)
    except OSError:
        pass
    alive[0] = False
    reader.join()
    client.close()
    print("client gone", flush=True)


def main():
    host, port_no = sys.argv[1].rsplit(":", 1)
    port = serial.serial_for_url("loop://", timeout=0.02, do_not_open=True)
    port.open()
    # PortManager purges through these: say so, then purge.
    for name in ("input", "output"):
        original = getattr(port, "reset_{}_buffer".format(name))

        def purge(original=original, name=name):
            print("purge {}".format(name), flush=True)
            original()

        setattr(port, "reset_{}_buffer".format(name), purge)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port_no)))
    srv.listen(1)
    print("listening", flush=True)
    while True:
        client, addr = srv.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        print("client {}:{}".format(*addr), flush=True)
        serve(client, port)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
