#!/usr/bin/python3
"""Uses a serial port through RFC 2217 the way an unmodified pyserial program does
(`serial.serial_for_url("rfc2217://HOST:PORT")`), on a port whose far end loops back (CTS
follows RTS, DSR follows DTR: pyserial's loop://, or a loopback plug). Used by ndd's RFC 2217
test; prints one line per check, `ok ...` or `FAIL ...`, and exits non-zero on a failure.

    python3 scripts/rfc2217-client-check.py 127.0.0.1:2217
"""

import sys
import time

import serial


def wait_for(what, f, timeout=5.0):
    end = time.time() + timeout
    while time.time() < end:
        if f():
            return True
        time.sleep(0.05)
    print("FAIL " + what, flush=True)
    return False


def main():
    url = "rfc2217://{}?poll_modem&timeout=5".format(sys.argv[1])
    s = serial.serial_for_url(url, baudrate=9600, timeout=5)
    ok = True

    # Every byte value, 255 (telnet's IAC) included, there and back.
    payload = bytes(range(256)) * 4 + b"\xff\xff end"
    s.write(payload)
    got = s.read(len(payload))
    if got == payload:
        print("ok echo {} bytes".format(len(got)), flush=True)
    else:
        ok = False
        print("FAIL echo: sent {} bytes, got {}".format(len(payload), len(got)), flush=True)

    # Line settings: set here, applied at the far port (the server prints them).
    s.baudrate = 57600
    s.parity = serial.PARITY_EVEN
    s.bytesize = serial.SEVENBITS
    s.stopbits = serial.STOPBITS_TWO
    print("ok settings 57600 7E2 accepted", flush=True)

    # Modem lines: RTS and DTR out, CTS and DSR back through the loopback.
    for rts in (False, True):
        s.rts = rts
        if wait_for("cts follows rts={}".format(rts), lambda: s.cts == rts):
            print("ok cts={} after rts={}".format(s.cts, rts), flush=True)
        else:
            ok = False
    for dtr in (False, True):
        s.dtr = dtr
        if wait_for("dsr follows dtr={}".format(dtr), lambda: s.dsr == dtr):
            print("ok dsr={} after dtr={}".format(s.dsr, dtr), flush=True)
        else:
            ok = False

    # Data still flows at the new settings.
    s.write(b"after the change\n")
    got = s.read(17)
    if got == b"after the change\n":
        print("ok echo after settings", flush=True)
    else:
        ok = False
        print("FAIL echo after settings: {!r}".format(got), flush=True)
    # A break held for 0.3 s, then both buffers purged: the far port's server prints them.
    s.break_condition = True
    time.sleep(0.3)
    s.break_condition = False
    s.reset_input_buffer()
    s.reset_output_buffer()
    print("ok break and purge sent", flush=True)
    s.close()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
