#!/usr/bin/env python3
"""Runs the workspace's test binaries, two at a time: what `cargo test --workspace` does, in
about half the time on two cores.

Most of the slow binaries wait on real processes (nats-server, Xvfb, PulseAudio, pyserial's
suite), sockets and clocks; the simulations are CPU-bound. `cargo test` runs the binaries one
after the other; here the longest start first and two run side by side, each with its tests
`RUST_TEST_THREADS` at a time, as under `cargo test`. Each binary runs in its package's
directory (as cargo runs it); its output is printed whole when it ends (all of it when it
fails), and the doc tests run last through cargo.

    scripts/test-run.py [--jobs N] [CARGO TEST ARGS...]

`--jobs` (or NDD_TEST_JOBS): binaries at once, 2 by default; 1 runs them one after the other
(the longest still first). CARGO TEST ARGS go to the build (e.g. `-p ndd-core`), not to the
binaries: filter tests by name with `cargo test` itself.
Exit status: 0 when every binary and the doc tests passed.
"""

import json
import os
import subprocess
import sys
import threading
import time

# Started first: the longest binaries here (seconds on two cores), so the two lanes end
# together. Any other binary runs after them in cargo's order.
SLOW_FIRST = [
    "pyserial_suite",
    "session_rate",
    "nats",
    "nats_publish",
    "session",
    "audio",
    "nats_keys",
    "two_processes",
    "display",
]

# Binaries that keep both cores busy by themselves (the simulations in ndd-testkit, the core
# crates' own unit tests: 1440p pictures coded, many schedules)...
CPU_BOUND = {"session_rate", "nats_publish", "nats_keys", "session", "nats_admit", "nats_runs", "pair_sim",
             "ndd_core", "ndd_link", "ndd_modules"}
# ...never run beside the ones whose real sound servers must keep time: a sound server
# starved of CPU by a simulation in the other lane lost a 10 ms block of a tone and failed a
# test that passes alone and beside two busy loops (a desktop runs its sound server at a
# raised priority; the tests' private ones run at the normal one).
KEEPS_TIME = {"audio"}


def fits(name, running):
    """Whether binary `name` may start beside the ones `running`."""
    # They run alone: beside each other (cli's and ndd-endpoint's `audio`, each with its own
    # sound servers) both lost tone blocks together under two busy loops, and on 2026-12-01
    # both lost one beside the endpoint `display` tests and other real-process binaries under
    # two busy loops (each passed 3 of 3 runs alone beside the loops). Some 30 s of one lane.
    if name in KEEPS_TIME:
        return not running
    return not any(r in KEEPS_TIME for r in running)


def selection(cargo_args):
    """`--workspace` unless the arguments name packages."""
    named = any(a in ("-p", "--package") or a.startswith("--package=") for a in cargo_args)
    return [] if named else ["--workspace"]


def binaries(cargo_args):
    """(name, executable, package directory) of every test binary, built first."""
    cmd = ["cargo", "test"] + selection(cargo_args) + ["--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd + cargo_args, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"test-run: `{' '.join(cmd + cargo_args)}` failed (exit {proc.returncode})")
    found = []
    for line in proc.stdout.splitlines():
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
            found.append((m["target"]["name"], m["executable"], os.path.dirname(m["manifest_path"])))
    rank = {n: i for i, n in enumerate(SLOW_FIRST)}
    found.sort(key=lambda b: rank.get(b[0], len(SLOW_FIRST)))
    return found


def main():
    args = sys.argv[1:]
    jobs = int(os.environ.get("NDD_TEST_JOBS", "2"))
    if args[:1] == ["--jobs"]:
        jobs, args = int(args[1]), args[2:]
    todo = binaries(args)
    lock = threading.Lock()
    failed = []
    started = time.monotonic()

    def run_one(name, exe, cwd):
        t = time.monotonic()
        rel = os.path.relpath(exe)
        with lock:
            # Said at once: a binary that hangs is named before anything kills the run.
            print(f"    Starting {name} (+{t - started:.0f} s)", flush=True)
        try:
            p = subprocess.run([exe, "-q"], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            output, code = p.stdout, p.returncode
        except OSError as e:
            output, code = f"test-run: cannot run {rel}: {e}\n", "not started"
        took = time.monotonic() - t
        with lock:
            print(f"     Running {name} ({rel}) [{took:.1f} s, +{time.monotonic() - started:.0f} s]", flush=True)
            sys.stdout.write(output)
            if code != 0:
                failed.append(f"{name} ({rel}): exit {code}")
            sys.stdout.flush()

    running = []

    def lane():
        while True:
            with lock:
                if not todo:
                    return
                # The first binary that fits beside the one running in the other lane (a
                # sound test waits for a simulation to end, and the other way round).
                i = next((i for i, b in enumerate(todo) if fits(b[0], running)), None)
                if i is not None:
                    b = todo.pop(i)
                    running.append(b[0])
            if i is None:
                time.sleep(0.2)
                continue
            try:
                run_one(*b)
            finally:
                with lock:
                    running.remove(b[0])

    lanes = [threading.Thread(target=lane) for _ in range(max(1, jobs))]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    print("   Doc-tests (cargo test --doc)", flush=True)
    doc = subprocess.run(["cargo", "test"] + selection(args) + ["--doc", "-q"] + args)
    if doc.returncode != 0:
        failed.append(f"doc tests: exit {doc.returncode}")
    if failed:
        print("test-run: FAILED:\n  " + "\n  ".join(failed), flush=True)
        return 1
    print(f"test-run: every test binary passed ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
