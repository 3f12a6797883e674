#!/usr/bin/env python3
"""Scenarios over emulated slow links (`starling sim --link_bandwidth_mbps
--link_latency_ms`): DiLoCo's Table 1 on our data, and the utilization of
overlapped rounds. Each runs real `starling sim` / `starling train`
processes, reads their summary.json files and writes DIR/SCENARIO.json and
DIR/SCENARIO.md (a markdown table), plus plots for `paper`.

  bench/wan.py paper [--out DIR] [--steps 2000]
      8 nodes, the small gpt on KJV, equal inner steps per node, every link
      100 Mbit/s with 50 ms latency: one node (no links), ddp, DiLoCo with
      H = 50, 200, 500, DiLoCo + int8, DiLoCo + int4 (error feedback) and
      gossip. ddp pays the latency on every step: by default its loss comes
      from a run without the emulator and its wall time from
      --ddp_link_steps steps under it, scaled to --steps (the table says
      so); --ddp_link_steps=0 runs all of it under the emulator.
  bench/wan.py utilization [--out DIR] [--steps 800]
      4 nodes, the default sim model, 100 Mbit/s and 100 ms links: DiLoCo
      with and without --overlap, at H=50 (--steps) and at H=200 (4x
      --steps; a round then computes about 10 s on 2 cores). Utilization =
      a node's compute seconds (inner steps) over its wall seconds,
      averaged over the nodes.

Wall time is the slowest node's (its start event to its summary), without
process start-up. Long: `paper` takes about 27 minutes on a 2-core machine,
`utilization` about 8 minutes; progress goes to stderr.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(binary, command, out, args):
    cmd = [binary, command, f"--out={out}"] + args
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"  {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    summary = json.load(open(os.path.join(out, "summary.json")))
    return summary, " ".join(cmd[1:])


def row(summary, command):
    nodes = summary["nodes"]
    final = summary["final"]
    wall = max(n["wall_seconds"] for n in nodes)
    util = [n["compute_seconds"] / n["wall_seconds"] for n in nodes
            if n.get("wall_seconds", 0) > 0]
    return {
        "command": command,
        "val_loss": final.get("val_loss"),
        "total_bytes": final.get("total_bytes", 0),
        "wall_seconds": wall,
        "utilization": sum(util) / len(util) if util else None,
        "rounds": len(summary.get("rounds", [])),
    }


def fmt_bytes(b):
    for unit in ["B", "KB", "MB", "GB"]:
        if b < 1000 or unit == "GB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{b:.0f} B"
        b /= 1000.0


def paper(args):
    link = [f"--link_bandwidth_mbps={args.bandwidth}",
            f"--link_latency_ms={args.latency}"]
    common = ["--nodes=8", f"--steps={args.steps}", "--seed=0",
              f"--eval_every={args.steps}", "--checkpoint_every=0"]
    rows = {}
    s, c = run(args.starling, "train", f"{args.out}/one-node",
               [f"--steps={args.steps}", "--seed=0",
                f"--eval_every={args.steps}", "--checkpoint_every=0"])
    rows["one node"] = row(s, c)
    rows["one node"]["total_bytes"] = 0
    # ddp: the loss does not depend on the link; its time does.
    s, c = run(args.starling, "sim", f"{args.out}/ddp",
               common + ["--algo=ddp"] + ([] if args.ddp_link_steps else link))
    ddp = row(s, c)
    if args.ddp_link_steps:
        short = [a for a in common if not a.startswith(("--steps=",
                                                        "--eval_every="))]
        s, c2 = run(args.starling, "sim", f"{args.out}/ddp-link",
                    short + ["--algo=ddp", f"--steps={args.ddp_link_steps}",
                             "--eval_every=0"] + link)
        timed = row(s, c2)
        ddp["wall_seconds"] = timed["wall_seconds"] * args.steps / args.ddp_link_steps
        ddp["utilization"] = timed["utilization"]
        ddp["wall_note"] = (f"scaled from {args.ddp_link_steps} steps under "
                            f"the emulator: {c2}")
    rows["ddp"] = ddp
    for name, extra in [("DiLoCo H=50", ["--inner_steps=50"]),
                        ("DiLoCo H=200", ["--inner_steps=200"]),
                        ("DiLoCo H=500", ["--inner_steps=500"]),
                        ("DiLoCo H=50 + int8", ["--inner_steps=50",
                                                "--compression=int8"]),
                        ("DiLoCo H=50 + int4 (error feedback)",
                         ["--inner_steps=50", "--compression=int4"]),
                        ("gossip, every 50 steps", ["--algo=gossip",
                                                    "--inner_steps=50"])]:
        d = name.split(",")[0].replace(" ", "-").replace("=", "").replace(
            "+", "").replace("(", "").replace(")", "").replace("--", "-")
        s, c = run(args.starling, "sim", f"{args.out}/{d}", common + extra + link)
        rows[name] = row(s, c)
    ddp_bytes = rows["ddp"]["total_bytes"] or 1
    for r in rows.values():
        r["bytes_vs_ddp"] = r["total_bytes"] / ddp_bytes
    md = [f"8 nodes × {args.steps} inner steps each (one node: {args.steps} "
          f"steps), gpt on KJV, every link {args.bandwidth} Mbit/s and "
          f"{args.latency} ms (`bench/wan.py paper --steps={args.steps}`).", "",
          "| run | val loss | bytes sent (all nodes) | bytes vs ddp | wall time | utilization |",
          "|---|---|---|---|---|---|"]
    for name, r in rows.items():
        note = " †" if "wall_note" in r else ""
        vs = "—" if name == "one node" else f"{r['bytes_vs_ddp']:.4f}×"
        md.append(f"| {name} | {r['val_loss']:.4f} | {fmt_bytes(r['total_bytes'])} "
                  f"| {vs} | {r['wall_seconds']:.0f} s{note} "
                  f"| {r['utilization']:.2f} |")
    if "wall_note" in rows["ddp"]:
        md += ["", "† " + rows["ddp"]["wall_note"] + "; its loss comes from the "
               "same run without the emulator."]
    plot(args.out, rows)
    return {"rows": rows, "markdown": "\n".join(md) + "\n"}


def plot(out, rows):
    """val loss against bytes and against wall time, as PNGs (gnuplot).

    One series per run, named in the key: runs that land close together
    (DiLoCo H=50 with and without int8) stay visible as open markers of
    their own shape and colour, where labels next to the points would
    print over each other."""
    data = os.path.join(out, "paper.dat")
    with open(data, "w") as f:
        for i, (name, r) in enumerate(rows.items()):
            f.write(f'{i} "{name}" {r["val_loss"]} {max(r["total_bytes"], 1)} '
                    f'{r["wall_seconds"]}\n')

    def series(column):
        parts = []
        for i, name in enumerate(rows):
            title = name.replace('"', "'")
            parts.append(f'"{data}" every ::{i}::{i} using {column}:3 with '
                         f'points pt {4 + 2 * (i % 5)} ps 1.8 lw 2 '
                         f'lc {i + 1} title "{title}"')
        return ", ".join(parts)

    script = f"""
set terminal pngcairo size 840,480
set grid
set ylabel "validation loss"
set key outside right top Left reverse samplen 1 font ",9"
set logscale x
set output "{out}/paper_loss_vs_bytes.png"
set xlabel "bytes sent, all nodes (log)"
plot {series(4)}
set output "{out}/paper_loss_vs_wall.png"
set xlabel "wall seconds (log)"
plot {series(5)}
"""
    try:
        subprocess.run(["gnuplot"], input=script.encode(), check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"plots skipped: {e}", file=sys.stderr)


def utilization(args):
    link = [f"--link_bandwidth_mbps={args.bandwidth}",
            f"--link_latency_ms={args.latency}"]
    rows = {}
    # H=50 as in the default sim (a round computes about 2 s here), and H=200
    # (about 10 s, where the fixed costs of the first and last rounds, which
    # are synchronous, and of the final evaluation weigh less).
    for h, steps in [(50, args.steps), (200, 4 * args.steps)]:
        common = [f"--steps={steps}", f"--inner_steps={h}", "--eval_every=0",
                  "--checkpoint_every=0",
                  f"--outer_momentum={args.outer_momentum}"] + link
        for name, extra in [("synchronous", []), ("--overlap", ["--overlap"])]:
            d = f"h{h}-" + ("sync" if not extra else "overlap")
            s, c = run(args.starling, "sim", f"{args.out}/utilization-{d}",
                       common + extra)
            r = row(s, c)
            r["inner_steps"] = h
            r["steps"] = steps
            r["node_utilization"] = {
                n["id"]: n["compute_seconds"] / n["wall_seconds"]
                for n in s["nodes"] if n.get("wall_seconds", 0) > 0}
            rows[f"H={h}, {name}"] = r
    md = [f"4 nodes, the default sim model, every link {args.bandwidth} Mbit/s "
          f"and {args.latency} ms, outer momentum {args.outer_momentum} "
          f"(`bench/wan.py utilization`). Utilization: compute seconds (inner "
          f"steps) over wall seconds, mean over the nodes; the lowest is the "
          f"node that ran the final evaluation.", "",
          "| H, rounds | steps | utilization, mean (lowest node) | wall time | val loss |",
          "|---|---|---|---|---|"]
    for name, r in rows.items():
        low = min(r["node_utilization"].values())
        md.append(f"| {name} | {r['steps']} | {r['utilization']:.3f} ({low:.3f}) | "
                  f"{r['wall_seconds']:.1f} s | {r['val_loss']:.4f} |")
    return {"rows": rows, "markdown": "\n".join(md) + "\n"}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["paper", "utilization"])
    p.add_argument("--out", default="runs/wan")
    p.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--bandwidth", type=float, default=100, help="Mbit/s")
    p.add_argument("--latency", type=float, default=None, help="ms")
    p.add_argument("--ddp_link_steps", type=int, default=100)
    p.add_argument("--outer_momentum", type=float, default=0.8)
    args = p.parse_args()
    if args.steps is None:
        args.steps = {"paper": 2000, "utilization": 800}[args.scenario]
    if args.latency is None:
        args.latency = {"paper": 50, "utilization": 100}[args.scenario]
    os.makedirs(args.out, exist_ok=True)
    result = {"paper": paper, "utilization": utilization}[args.scenario](args)
    result["scenario"] = args.scenario
    with open(os.path.join(args.out, f"{args.scenario}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, f"{args.scenario}.md"), "w") as f:
        f.write(result["markdown"])
    print(result["markdown"])


if __name__ == "__main__":
    main()
