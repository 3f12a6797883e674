#!/usr/bin/env python3
"""A joiner's state transfer against raw loopback TCP, at several model sizes.

For each --widths entry: starts a `starling node` (gpt, 2 layers, that width,
KJV) that trains alone, waits for its first committed round, then starts a
second node that joins through it and fetches θ_global and the outer
optimizer state (chunked, zstd, checksummed). The joiner's `state_transfer`
event gives the bytes and seconds. Loopback throughput is measured in the
same run (a TCP connection on 127.0.0.1 carrying --loopback_mib MiB), before
each transfer, and the table compares the transfer against it, the way issue
#5 states its bound: at most 1.5 x bytes / loopback + a small constant.

  bench/state_transfer.py [--out DIR] [--widths 256,512,1024] [--repeats 3]

Writes DIR/state_transfer.json and DIR/state_transfer.md and prints the
table; progress goes to stderr. About 2 minutes on a 2-core machine.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def loopback_bytes_per_second(mib):
    """Bytes per second through one loopback TCP connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    total = mib << 20
    buf = bytearray(1 << 20)

    def write():
        view = memoryview(bytes(1 << 20))
        for _ in range(mib):
            client.sendall(view)

    t0 = time.perf_counter()
    writer = threading.Thread(target=write)
    writer.start()
    got = 0
    while got < total:
        n = conn.recv_into(buf)
        if n == 0:
            break
        got += n
    writer.join()
    seconds = time.perf_counter() - t0
    for s in (conn, client, server):
        s.close()
    return got / seconds


def wait_for(path, pattern, timeout):
    """The first match of `pattern` in the file at `path`, within `timeout`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                m = re.search(pattern, f.read())
            if m:
                return m
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {pattern!r} in {path}")


def events(path, kind):
    with open(path) as f:
        return [e for e in map(json.loads, f) if e.get("event") == kind]


def transfer(args, width, out, rep):
    """Runs one donor and one joiner; returns the joiner's state_transfer."""
    common = [args.starling, "node", "--data=kjv", "--model=gpt", "--layers=2",
              f"--width={width}", "--heads=4", "--context=32", "--batch=4",
              "--steps=1000000", "--inner_steps=2", "--threads=1",
              "--eval_every=0", "--checkpoint_every=0", "--min_members=1",
              f"--run_id=transfer-{width}-{rep}", "--listen=127.0.0.1:0",
              f"--chunk_bytes={args.chunk_bytes}", "--insecure"]
    procs = []
    try:
        os.makedirs(out, exist_ok=True)
        n0_log = os.path.join(out, "n0.log")
        with open(n0_log, "w") as log:
            procs.append(subprocess.Popen(
                common + ["--node_id=n0", f"--out={out}/n0"],
                stdout=log, stderr=subprocess.STDOUT))
        address = wait_for(n0_log, r"listening on (\S+),", 120).group(1)
        wait_for(os.path.join(out, "n0", "events.jsonl"), r'"round":1\b', 300)
        n1_log = os.path.join(out, "n1.log")
        with open(n1_log, "w") as log:
            procs.append(subprocess.Popen(
                common + ["--node_id=n1", f"--out={out}/n1",
                          f"--peers={address}"],
                stdout=log, stderr=subprocess.STDOUT))
        n1_events = os.path.join(out, "n1", "events.jsonl")
        wait_for(n1_events, r'"event":"state_transfer"', 300)
        ev = events(n1_events, "state_transfer")[0]
        start = events(os.path.join(out, "n0", "events.jsonl"), "start")[0]
        return ev, start["parameters"]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/state-transfer")
    p.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    p.add_argument("--widths", default="256,512,1024",
                   help="gpt widths (2 layers), comma-separated")
    p.add_argument("--repeats", type=int, default=3,
                   help="transfers per width; the median is reported")
    p.add_argument("--loopback_mib", type=int, default=256)
    p.add_argument("--chunk_bytes", type=int, default=1 << 20)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for width in [int(w) for w in args.widths.split(",")]:
        runs = []
        for rep in range(args.repeats):
            loopback = loopback_bytes_per_second(args.loopback_mib)
            ev, params = transfer(args, width,
                                  os.path.join(args.out, f"w{width}-{rep}"), rep)
            runs.append({"seconds": ev["seconds"], "bytes": ev["bytes"],
                         "retries": ev["retries"],
                         "loopback_bytes_per_second": loopback,
                         "loopback_seconds": ev["bytes"] / loopback})
            print(f"width {width} run {rep}: {ev['bytes'] / 1e6:.1f} MB in "
                  f"{ev['seconds']:.3f} s (loopback {loopback / 1e9:.2f} GB/s)",
                  file=sys.stderr, flush=True)
        seconds = statistics.median(r["seconds"] for r in runs)
        loop_s = statistics.median(r["loopback_seconds"] for r in runs)
        nbytes = runs[0]["bytes"]
        rows.append({
            "width": width, "parameters": params, "bytes": nbytes,
            "seconds": seconds, "loopback_seconds": loop_s,
            "ratio_to_loopback": seconds / loop_s,
            "bytes_per_second": nbytes / seconds,
            # the constant the bound would need: seconds - 1.5 x loopback
            "constant_needed_seconds": max(0.0, seconds - 1.5 * loop_s),
            "runs": runs})
    md = [f"Joiner state transfer vs raw loopback TCP, median of "
          f"{args.repeats} (`bench/state_transfer.py --widths={args.widths}`). "
          "Constant needed: transfer − 1.5 × loopback time.", "",
          "| model | parameters | state bytes | transfer | loopback time | ratio | throughput | constant needed |",
          "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        md.append(f"| gpt 2×{r['width']} | {r['parameters']:,} | "
                  f"{r['bytes'] / 1e6:.1f} MB | {r['seconds'] * 1e3:.0f} ms | "
                  f"{r['loopback_seconds'] * 1e3:.1f} ms | "
                  f"{r['ratio_to_loopback']:.0f}× | "
                  f"{r['bytes_per_second'] / 1e6:.0f} MB/s | "
                  f"{r['constant_needed_seconds'] * 1e3:.0f} ms |")
    result = {"rows": rows, "markdown": "\n".join(md) + "\n"}
    with open(os.path.join(args.out, "state_transfer.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, "state_transfer.md"), "w") as f:
        f.write(result["markdown"])
    print(result["markdown"])


if __name__ == "__main__":
    main()
