#!/usr/bin/env python3
"""A poisoned peer against each --aggregate rule (`starling sim` runs).

Runs the default sim (the small gpt on KJV, DiLoCo H=50, 16 rounds) with 5
nodes, clean and with node n4 poisoned: it sends NaN in rounds 2-5, its
pseudo-gradient x1000 in rounds 6-9 and Gaussian noise of its RMS in rounds
10-13 (--poison). Each poisoned run is compared with the clean mean run:
final validation loss, whether all members ended bit-identical, how many
contributions the members dropped, and the bytes the swarm sent.

  bench/poisoned_peer.py [--out DIR] [--runs NAME,NAME...]

Writes DIR/poisoned_peer.json and DIR/poisoned_peer.md and prints the table.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POISON = "n4:nan@2-5+x1000@6-9+noise@10-13"

# name -> (extra sim flags, poisoned)
RUNS = {
    "clean mean": ([], False),
    "clean trimmed_mean:1": (["--aggregate=trimmed_mean:1"], False),
    "mean (no norm bound)": ([], True),
    "mean + norm_bound=10": (["--norm_bound=10"], True),
    "trimmed_mean:1": (["--aggregate=trimmed_mean:1"], True),
    "median": (["--aggregate=median"], True),
    "norm_clip:2": (["--aggregate=norm_clip:2"], True),
}


def run(name, flags, poisoned, out_root, binary):
    out = os.path.join(out_root, "".join(
        c if c.isalnum() else "_" for c in name).strip("_"))
    shutil.rmtree(out, ignore_errors=True)  # this script's own scratch run
    cmd = [binary, "sim", "--nodes=5", f"--out={out}"] + flags
    if poisoned:
        cmd.append(f"--poison={POISON}")
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - start
    result = {"command": " ".join(["starling"] + cmd[1:]), "exit": proc.returncode,
              "wall_seconds": round(wall, 1)}
    if proc.returncode != 0:
        result["error"] = proc.stderr[-2000:]
        return result
    with open(os.path.join(out, "summary.json")) as f:
        final = json.load(f)["final"]
    dropped, nonfinite, refused = 0, 0, 0
    for path in glob.glob(os.path.join(out, "n*", "summary.json")):
        with open(path) as f:
            dropped += int(json.load(f).get("contributions_dropped", 0))
    # Non-finite values in any member's model would show as a NaN loss; the
    # ring refuses NaN messages at the receiver (logged "rejected").
    for path in glob.glob(os.path.join(out, "n*", "node.log")):
        with open(path, errors="replace") as f:
            for line in f:
                if "non-finite" in line:
                    nonfinite += 1
                if "rejected" in line or "refused" in line:
                    refused += 1
    result.update({
        "val_loss": final.get("val_loss"),
        "all_hashes_agree": final.get("all_hashes_agree"),
        "rounds": final.get("rounds"),
        "members_at_end": final.get("members_at_end"),
        "total_bytes": final.get("total_bytes"),
        "contributions_dropped": dropped,
        "nonfinite_log_lines": nonfinite,
        "refusal_log_lines": refused,
    })
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="/tmp/starling_poisoned_peer")
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "starling"))
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    # Runs of an earlier invocation with the same --out are kept (and
    # replaced by the ones run now).
    results = {}
    previous = os.path.join(a.out, "poisoned_peer.json")
    if os.path.exists(previous):
        with open(previous) as f:
            results = json.load(f).get("runs", {})
    for name in a.runs.split(","):
        flags, poisoned = RUNS[name]
        print(f"[{name}] running...", file=sys.stderr, flush=True)
        results[name] = run(name, flags, poisoned, a.out, a.binary)
        print(f"[{name}] {json.dumps(results[name])}", file=sys.stderr,
              flush=True)
    base = results.get("clean mean", {}).get("val_loss")
    results = {k: results[k] for k in RUNS if k in results}
    lines = ["| run | val loss | vs clean mean | bit-identical | dropped | "
             "MB sent |", "|---|---:|---:|---|---:|---:|"]
    for name, r in results.items():
        if "val_loss" not in r:
            lines.append(f"| {name} | failed (exit {r['exit']}) | | | | |")
            continue
        vl = r["val_loss"]
        rel = (f"{100 * (vl / base - 1):+.1f}%"
               if base and vl is not None and vl == vl else "")
        lines.append(
            f"| {name} | {vl:.4f} | {rel} | "
            f"{'yes' if r['all_hashes_agree'] else 'NO'} | "
            f"{r['contributions_dropped']} | {r['total_bytes'] / 1e6:.1f} |")
    table = "\n".join(lines)
    doc = {"poison": POISON, "nodes": 5, "runs": results}
    with open(os.path.join(a.out, "poisoned_peer.json"), "w") as f:
        json.dump(doc, f, indent=2)
    with open(os.path.join(a.out, "poisoned_peer.md"), "w") as f:
        f.write(table + "\n")
    print(json.dumps(doc, indent=2))
    print(table)


if __name__ == "__main__":
    main()
