#!/usr/bin/env python3
"""Scenario benchmarks of adaptive sync and gossip (`starling sim` runs).

Each scenario runs real `starling sim` processes, reads their summary.json and
events.jsonl files, and writes one JSON object (and prints it):

  bench/adaptive_sync.py hetero [--out DIR]   4 nodes, n3 4x slower: fixed-H
      DiLoCo against time-bounded rounds (--round_seconds) at equal steps and
      at equal wall time.
  bench/adaptive_sync.py drift [--out DIR]    4 nodes, drift on n0,n1: fixed
      H=50 against adaptive H in [10, 100] with the Page-Hinkley detector.
  bench/adaptive_sync.py gossip [--out DIR]   8 nodes: gossip (plain, and with
      SlowMo momentum 0.5) against DiLoCo at equal samples.

Throughput: the swarm's rate is the samples of all nodes over the nodes' wall
time; a node's standalone rate is its samples over its own compute seconds
(the throttle of --slow included), measured in the same run, so the ratio is
the share of the nodes' capacity the protocol turns into training.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sim(binary, out, args):
    cmd = [binary, "sim", f"--out={out}"] + args
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True)
    wall = time.time() - t0
    summary = json.load(open(os.path.join(out, "summary.json")))
    return summary, wall, cmd


def events(out):
    evs = []
    for path in sorted(glob.glob(os.path.join(out, "n*", "events.jsonl"))):
        node = os.path.basename(os.path.dirname(path))
        for line in open(path):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            ev.setdefault("node", node)
            evs.append(ev)
    return evs


def throughput(summary, wall):
    nodes = summary["nodes"]
    # The nodes' own wall time (from their start event to their summary),
    # without the sim's process start-up and report.
    wall = max(n["wall_seconds"] for n in nodes)
    samples = sum(n["samples"] for n in nodes)
    standalone = sum(n["samples"] / n["compute_seconds"] for n in nodes
                     if n.get("compute_seconds", 0) > 0)
    rates = {n["id"]: n["samples"] / n["compute_seconds"] for n in nodes
             if n.get("compute_seconds", 0) > 0}
    return {
        "node_wall_seconds": wall,
        "samples": samples,
        "samples_per_second": samples / wall,
        "standalone_samples_per_second": standalone,
        "share_of_standalone": samples / wall / standalone,
        "node_rates": rates,
    }


def run_summary(summary, wall, cmd):
    final = summary["final"]
    return {
        "command": " ".join(cmd[1:]),
        "wall_seconds": wall,
        "val_loss": final.get("val_loss"),
        "total_bytes": final.get("total_bytes"),
        "rounds": len(summary.get("rounds", [])),
    }


def hetero(args):
    # Evaluation only at the end: an evaluating node is not training, and
    # the standalone rates count training only.
    common = ["--slow=n3:4x", f"--steps={args.steps}", "--seed=1",
              "--eval_every=0"]
    out = {}
    s, w, c = sim(args.starling, f"{args.out}/hetero-fixed", common)
    fixed = run_summary(s, w, c) | throughput(s, w)
    slow_rate = fixed["node_rates"].get("n3", 0)
    fixed["four_times_slow_node_rate"] = 4 * slow_rate
    out["fixed_h"] = fixed
    timed_args = common + [f"--round_seconds={args.round_seconds}"]
    s, w, c = sim(args.starling, f"{args.out}/hetero-timed", timed_args)
    out["timed"] = run_summary(s, w, c) | throughput(s, w)
    # Equal wall time: more steps for the time-bounded run, scaled by the
    # ratio of the two walls (the schedule then ends when fixed-H's does).
    steps = int(args.steps * fixed["wall_seconds"] / out["timed"]["wall_seconds"])
    eq_args = [a for a in timed_args if not a.startswith("--steps=")]
    eq_args.append(f"--steps={steps}")
    s, w, c = sim(args.starling, f"{args.out}/hetero-timed-equal-wall", eq_args)
    out["timed_equal_wall"] = run_summary(s, w, c) | throughput(s, w)
    return out


def drift_metrics(out, drift_step):
    evs = events(out)
    detected = sorted(e["step"] for e in evs
                      if e.get("event") == "drift_detected" and e["step"] >= drift_step)
    false_alarms = sum(1 for e in evs if e.get("event") == "drift_detected"
                       and e["step"] < drift_step)
    evals = sorted((e["step"], e["val_loss"], e.get("wall_seconds", 0))
                   for e in evs if e.get("event") == "eval")
    # The evaluation at the drift step itself already sees the new data.
    before = [v for s, v, _ in evals if s < drift_step]
    pre = before[-1] if before else None
    after = [(s, v, t) for s, v, t in evals if s >= drift_step]
    peak = max((v for _, v, _ in after), default=None)
    recovered = next(((s, t) for s, v, t in after if pre is not None and v <= pre), None)
    return {
        "detection_step": detected[0] if detected else None,
        "detection_delay_steps": detected[0] - drift_step if detected else None,
        "alarms_after_drift": len(detected),
        "alarms_before_drift": false_alarms,
        "val_loss_before_drift": pre,
        "val_loss_peak_after_drift": peak,
        "recovered_at_step": recovered[0] if recovered else None,
        "recovery_steps": recovered[0] - drift_step if recovered else None,
        "evals": evals,
    }


def drift(args):
    common = [f"--drift=n0,n1@{args.drift_step}", f"--steps={args.steps}",
              f"--eval_every={args.eval_every}", "--seed=1"]
    out = {"drift_step": args.drift_step}
    for name, extra in [("fixed_h", ["--inner_steps=50", "--drift_detector=off"]),
                        ("adaptive", ["--inner_steps=50", "--min_inner_steps=10",
                                      "--max_inner_steps=100"])]:
        d = f"{args.out}/drift-{name}"
        s, w, c = sim(args.starling, d, common + extra)
        out[name] = run_summary(s, w, c) | drift_metrics(d, args.drift_step)
    return out


def node_val_losses(out):
    losses = {}
    for path in sorted(glob.glob(os.path.join(out, "n*", "summary.json"))):
        node = os.path.basename(os.path.dirname(path))
        losses[node] = json.load(open(path))["final"].get("val_loss")
    return losses


def gossip(args):
    common = ["--nodes=8", f"--steps={args.steps}", "--seed=1"]
    out = {}
    for name, extra in [("diloco", []), ("gossip", ["--algo=gossip"]),
                        ("gossip_momentum", ["--algo=gossip",
                                             "--gossip_momentum=0.5"])]:
        s, w, c = sim(args.starling, f"{args.out}/gossip-{name}", common + extra)
        out[name] = run_summary(s, w, c) | {"consensus": s.get("consensus", []),
                                            "node_val_loss": node_val_losses(
                                                f"{args.out}/gossip-{name}")}
        out[name]["samples"] = sum(n["samples"] for n in s["nodes"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=["hetero", "drift", "gossip"])
    p.add_argument("--out", default="runs/bench")
    p.add_argument("--starling", default=os.path.join(ROOT, "build", "starling"))
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--round_seconds", type=float, default=4.0)
    p.add_argument("--drift_step", type=int, default=600)
    p.add_argument("--eval_every", type=int, default=50)
    p.add_argument("--json", default=None, help="write the result here too")
    args = p.parse_args()
    if args.steps is None:
        args.steps = {"hetero": 800, "drift": 1600, "gossip": 800}[args.scenario]
    result = {"hetero": hetero, "drift": drift, "gossip": gossip}[args.scenario](args)
    result["scenario"] = args.scenario
    text = json.dumps(result, indent=2)
    print(text)
    path = args.json or os.path.join(args.out, f"{args.scenario}.json")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    open(path, "w").write(text + "\n")


if __name__ == "__main__":
    main()
