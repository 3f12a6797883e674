#!/usr/bin/env python3
"""The cost of relays: `starling sim` with and without emulated NAT.

Runs the default sim (4 nodes, gpt 2x64 on KJV, 800 steps, H=50) and the same
with `--nat=n2,n3` (those two reachable only through relays), alternating,
`--repeats` times each, and writes one JSON object (and prints it):

  /usr/bin/python3 bench/nat_sim.py [--binary build/starling] [--repeats 2]
      [--out DIR] [--nat n2,n3] [-- EXTRA SIM FLAGS]

Per run: the final val_loss, rounds, every node's mean round sync time
(`sync_seconds` of its round events: the exchange, not the inner steps),
the sim's wall time, total bytes sent, and the bytes each relay forwarded
(`relay_forwarded_by_member` of its summary.json). The ratios compare the
means of the two kinds of run, measured back to back on one machine.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def run(binary, out, extra):
    cmd = [binary, "sim", f"--out={out}"] + extra
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    wall = time.time() - t0
    summary = json.load(open(os.path.join(out, "summary.json")))
    final = summary["final"]
    syncs, relays = [], {}
    for entry in sorted(os.listdir(out)):
        events = os.path.join(out, entry, "events.jsonl")
        if not os.path.exists(events):
            continue
        for line in open(events):
            ev = json.loads(line)
            if ev.get("event") == "round" and "sync_seconds" in ev:
                syncs.append(ev["sync_seconds"])
        node = json.load(open(os.path.join(out, entry, "summary.json")))
        if node.get("relay_forwarded_bytes"):
            relays[entry] = node.get("relay_forwarded_by_member", {})
    return {
        "command": " ".join(cmd),
        "val_loss": final.get("val_loss"),
        "rounds": len(summary.get("rounds", [])),
        "mean_sync_seconds": statistics.mean(syncs) if syncs else None,
        "wall_seconds": wall,
        "total_bytes": final.get("total_bytes"),
        "relay_forwarded_bytes": final.get("relay_forwarded_bytes", 0),
        "relays": relays,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", default="build/starling")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--nat", default="n2,n3")
    p.add_argument("--out", default="/tmp/starling-nat-sim")
    p.add_argument("extra", nargs="*", help="more sim flags (after --)")
    a = p.parse_args()
    runs = {"direct": [], "nat": []}
    for i in range(a.repeats):
        for kind in ("direct", "nat"):
            extra = list(a.extra)
            if kind == "nat":
                extra.append(f"--nat={a.nat}")
            runs[kind].append(
                run(a.binary, os.path.join(a.out, f"{kind}{i}"), extra))

    def mean(kind, key):
        return statistics.mean(r[key] for r in runs[kind])

    result = {
        "runs": runs,
        "val_loss_relative": mean("nat", "val_loss") / mean("direct",
                                                            "val_loss") - 1,
        "sync_seconds_ratio": mean("nat", "mean_sync_seconds") /
        mean("direct", "mean_sync_seconds"),
        "wall_ratio": mean("nat", "wall_seconds") / mean("direct",
                                                          "wall_seconds"),
        "relay_forwarded_bytes_mean": mean("nat", "relay_forwarded_bytes"),
        "total_bytes_mean": {k: mean(k, "total_bytes") for k in runs},
    }
    text = json.dumps(result, indent=2)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "nat_sim.json"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
