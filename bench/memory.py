#!/usr/bin/env python3
"""Memory per node of a 4-node DiLoCo sim with a checkpoint every round.

For each build, size and compression: runs `starling sim --nodes=4` (gpt on
KJV, --inner_steps=H, --steps=rounds x H, --checkpoint_every=H, so every
round but the last writes a checkpoint and the run ends with its final one),
and samples every node process's VmRSS and VmHWM from /proc/PID/status every
--interval seconds. Per node it reports the peak (the largest VmHWM seen)
and the steady RSS (the median VmRSS over the second half of the node's
life: rounds and checkpoints, not start-up), both in bytes per parameter,
and per run the largest peak and the mean steady of its nodes, beside the
peak each node's start-up memory check planned for (core/memory.h, the
"memory plan" line of its node.log).

Then, per build and size, bench/checkpoint_bench (built next to starling)
writes the same trainer's checkpoint (plus one fp32 copy of the weights as
the node's outer momentum) and copies it with `cp`, back to back, three
times: the checkpoint write time against `cp` and `cp` + `sync FILE`, the
resume time, and the memory a write and a resume add on top of the trainer.

  bench/memory.py [--builds before=/tmp/old-build,after=build] [--out DIR]
      [--sizes 3M,19M] [--compressions fp32,int8,topk:0.01+int8]
      [--rounds 3] [--inner_steps 2]

A build is a directory that holds starling and bench/checkpoint_bench
(checkpoint_bench may be absent: then no timings). Writes DIR/memory.json
and DIR/memory.md and prints the table; progress goes to stderr. About 10
minutes per build with the defaults on a 2-core machine. Memory is what it
measures; its times are compared only within one checkpoint_bench run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# gpt shapes (KJV, context 64) and their parameter counts.
SIZES = {
    "0.1M": {"layers": 2, "width": 64, "heads": 4},  # 0.14 M: the fixed cost
    "3M": {"layers": 4, "width": 256, "heads": 4},   # 3.2 M
    "19M": {"layers": 6, "width": 512, "heads": 8},  # 19.2 M
}


def status_bytes(pid):
    """(VmRSS, VmHWM, RssAnon) of `pid` in bytes, or None once gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None
    got = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            got[key] = int(value.split()[0]) * 1024
    if len(got) < 3:
        return None  # a zombie has no memory lines
    return got["VmRSS"], got["VmHWM"], got["RssAnon"]


def node_processes(root_pid):
    """{pid: node id} of the `starling node` processes below `root_pid`."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            todo.append(child)
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if len(argv) > 1 and argv[1] == "node":
                ids = [a.split("=", 1)[1] for a in argv
                       if a.startswith("--node_id=")]
                found[child] = ids[0] if ids else str(child)
    return found


def parameters(run_dir):
    with open(os.path.join(run_dir, "n0", "events.jsonl")) as f:
        for line in f:
            event = json.loads(line)
            if event.get("event") == "start" and "parameters" in event:
                return event["parameters"]
    raise RuntimeError(f"no start event in {run_dir}/n0/events.jsonl")


def planned_peak(run_dir, node):
    """The peak the node's start-up check planned for (its "memory plan"
    line), in bytes; None when its log has none."""
    try:
        with open(os.path.join(run_dir, node, "node.log")) as f:
            for line in f:
                _, found, rest = line.partition("memory plan (")
                if found:
                    return int(rest.split(" ", 1)[0])
    except OSError:
        pass
    return None


def run_sim(starling, size, compression, args, run_dir):
    """Runs one sim; returns its per-node memory figures."""
    shape = SIZES[size]
    cmd = [starling, "sim", "--nodes=4", f"--out={run_dir}",
           f"--layers={shape['layers']}", f"--width={shape['width']}",
           f"--heads={shape['heads']}", f"--inner_steps={args.inner_steps}",
           f"--steps={args.rounds * args.inner_steps}",
           f"--checkpoint_every={args.inner_steps}", "--eval_every=0",
           # The run's one evaluation (at its end) over 0.2% of KJV, not 5%:
           # minutes less at 19M parameters, and far smaller than a step.
           "--val_fraction=0.002",
           f"--compression={compression}", "--seed=0"]
    start = time.time()
    with open(os.path.join(os.path.dirname(run_dir),
                           os.path.basename(run_dir) + ".log"), "w") as log:
        sim = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        samples = {}  # node id -> [(seconds, rss, anon)]
        peaks = {}
        pids = {}
        while sim.poll() is None:
            pids.update(node_processes(sim.pid))
            now = time.time() - start
            for pid, node in pids.items():
                got = status_bytes(pid)
                if got is None:
                    continue
                samples.setdefault(node, []).append((now, got[0], got[2]))
                peaks[node] = max(peaks.get(node, 0), got[1])
            time.sleep(args.interval)
    if sim.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {sim.returncode}")
    n = parameters(run_dir)
    nodes = {}
    for node, series in sorted(samples.items()):
        t0, t1 = series[0][0], series[-1][0]
        late = [s for s in series if s[0] >= (t0 + t1) / 2]
        # Every tenth of a second, for plots: [seconds, VmRSS, RssAnon].
        trace, last = [], -1.0
        for t, rss, anon in series:
            if t - last >= 0.1:
                trace.append([round(t, 2), rss, anon])
                last = t
        nodes[node] = {"peak_bytes": peaks[node],
                       "steady_bytes": statistics.median(s[1] for s in late),
                       "peak_anon_bytes": max(s[2] for s in series),
                       "steady_anon_bytes":
                           statistics.median(s[2] for s in late),
                       # The mapped files' pages (VmRSS - RssAnon): the
                       # code, shared between the nodes.
                       "peak_file_bytes": max(s[1] - s[2] for s in series),
                       "plan_peak_bytes": planned_peak(run_dir, node),
                       "samples": len(series), "rss_trace": trace}
    return {
        "size": size, "compression": compression, "parameters": n,
        "seconds": time.time() - start, "command": " ".join(cmd[1:]),
        "peak_bytes_per_param": max(v["peak_bytes"] for v in nodes.values()) / n,
        "steady_bytes_per_param":
            statistics.mean(v["steady_bytes"] for v in nodes.values()) / n,
        "peak_anon_bytes_per_param":
            max(v["peak_anon_bytes"] for v in nodes.values()) / n,
        "steady_anon_bytes_per_param":
            statistics.mean(v["steady_anon_bytes"] for v in nodes.values()) / n,
        "plan_peak_bytes_per_param":
            max((v["plan_peak_bytes"] or 0) for v in nodes.values()) / n,
        # The plan over each node's own peak: >= 1 where it bounds it.
        "plan_over_peak_min":
            min((v["plan_peak_bytes"] or 0) / v["peak_bytes"]
                for v in nodes.values()),
        "nodes": nodes,
    }


def run_checkpoint_bench(tool, size, work_dir):
    shape = SIZES[size]
    os.makedirs(work_dir, exist_ok=True)
    out = subprocess.run(
        [tool, f"--layers={shape['layers']}", f"--width={shape['width']}",
         f"--heads={shape['heads']}", f"--dir={work_dir}", "--repeats=3"],
        check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def markdown(results):
    md = ["Peak and steady RSS per node of a 4-node sim with a checkpoint "
          "every round, in bytes per parameter (peak: the largest node's "
          "VmHWM; steady: the nodes' mean of their median VmRSS over the "
          "second half of the run; plan: the largest peak the nodes' "
          "start-up memory check planned for; plan / peak: the smallest, over "
          "the nodes, of a node's plan over its own VmHWM, >= 1 where the "
          "plan bounds the peak).", "",
          "| build | model | parameters | compression | peak B/param | "
          "steady B/param | plan B/param | plan / peak | peak GiB | "
          "sim seconds |",
          "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for build, r in results["runs"]:
        peak = r["peak_bytes_per_param"] * r["parameters"] / 2**30
        md.append(f"| {build} | {r['size']} | {r['parameters']:,} | "
                  f"{r['compression']} | {r['peak_bytes_per_param']:.1f} | "
                  f"{r['steady_bytes_per_param']:.1f} | "
                  f"{r.get('plan_peak_bytes_per_param', 0):.1f} | "
                  f"{r.get('plan_over_peak_min', 0):.2f} | "
                  f"{peak:.2f} | "
                  f"{r['seconds']:.0f} |")
    if results["checkpoints"]:
        md += ["", "Checkpoint write (trainer + one copy of the weights as "
               "the outer state) against `cp` of the same file, medians of "
               "3 back to back; memory a write or a resume adds over the "
               "trainer, in bytes per parameter.", "",
               "| build | model | file MB | write s | cp s | cp+sync s | "
               "write/cp | write/(cp+sync) | resume s | write +B/param | "
               "resume +B/param |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for build, size, c in results["checkpoints"]:
            n = c["parameters"]
            md.append(
                f"| {build} | {size} | {c['file_bytes'] / 1e6:.0f} | "
                f"{c['write_seconds_median']:.2f} | "
                f"{c['cp_seconds_median']:.2f} | "
                f"{c['cp_sync_seconds_median']:.2f} | "
                f"{c['write_seconds_median'] / c['cp_seconds_median']:.2f} | "
                f"{c['write_seconds_median'] / c['cp_sync_seconds_median']:.2f}"
                f" | {c['resume_seconds_median']:.2f} | "
                f"{c['write_peak_bytes_median'] / n:.1f} | "
                f"{c['resume_peak_bytes_median'] / n:.1f} |")
    return "\n".join(md) + "\n"


def main():
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--builds", default=f"this={os.path.join(ROOT, 'build')}",
                   help="LABEL=BUILD_DIR,... run one after the other")
    p.add_argument("--out", default="runs/memory")
    p.add_argument("--sizes", default="3M,19M")
    p.add_argument("--compressions", default="fp32,int8,topk:0.01+int8")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inner_steps", type=int, default=2)
    p.add_argument("--interval", type=float, default=0.02,
                   help="seconds between RSS samples")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    out = os.path.abspath(args.out)
    results = {"rounds": args.rounds, "inner_steps": args.inner_steps,
               "runs": [], "checkpoints": []}
    for spec in args.builds.split(","):
        label, build = spec.split("=", 1)
        starling = os.path.join(build, "starling")
        tool = os.path.join(build, "bench", "checkpoint_bench")
        for size in args.sizes.split(","):
            if os.path.exists(tool):
                print(f"{label} {size}: checkpoint_bench", file=sys.stderr,
                      flush=True)
                c = run_checkpoint_bench(tool, size, os.path.join(out, "ckpt"))
                results["checkpoints"].append([label, size, c])
            for comp in args.compressions.split(","):
                name = f"{label}-{size}-{comp.replace(':', '_')}"
                print(f"{label} {size} {comp}: sim", file=sys.stderr,
                      flush=True)
                r = run_sim(starling, size, comp, args,
                            os.path.join(out, name))
                results["runs"].append([label, r])
                print(f"  peak {r['peak_bytes_per_param']:.1f} B/param, "
                      f"steady {r['steady_bytes_per_param']:.1f} B/param, "
                      f"{r['seconds']:.0f} s", file=sys.stderr, flush=True)
    results["markdown"] = markdown(results)
    with open(os.path.join(out, "memory.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(out, "memory.md"), "w") as f:
        f.write(results["markdown"])
    print(results["markdown"])


if __name__ == "__main__":
    main()
