#!/usr/bin/env python3
"""The Python module's overhead per DiLoCo round against `starling node`.

Runs the same TorchScript model (python/starling_models.py's gpt, traced),
batch, context, H and thread count over and over, alternating: N `starling
node` members, then N Python members (the `starling` module's DiLoCo in a
plain PyTorch loop with AdamW), then N Python members whose loop uses
PyTorch's faster standard options (--python_variants: `fast` is
AdamW(foreach=True) and zero_grad(set_to_none=True)), and so on for
--repeats. Per run it takes the mean over the rounds after the first (the
first holds the join) of:
  - the round's wall time (inner steps included);
  - its non-training part (C++: the exchange, the copy and the outer step
    from the round split; Python: the time inside d.step() on a round);
  - the mean inner step (C++: the round's inner_seconds / its steps;
    Python: batch, forward, backward, clipping and optimizer step, timed
    around the user's own code, d.step() excluded);
  - the overhead: the round's wall time less H inner steps of that side.
The ratio at equal step time, (H·t_cxx + overhead_py) / (H·t_cxx +
overhead_cxx), is what a Python member's round would take against the
node's if its inner steps were as fast as the node's: Starling's part only.
Prints one JSON object: {"cxx": {...}, "python": {...}, "python_fast":
{...}, "ratio_round": python/cxx, "ratio_round_equal_step", ...}.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py \\
        --starling=build/starling --out=/tmp/py-overhead
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMBER_CODE = r'''
import json, sys, time, torch, starling
(path, node_id, listen, peers, n, steps, h, batch, context, threads,
 variant) = sys.argv[1:]
torch.set_num_threads(int(threads))
steps, h, batch, context = int(steps), int(h), int(batch), int(context)
fast = variant == "fast"
model = torch.jit.load(path)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3,
                        **({"foreach": True} if fast else {}))
gen = torch.Generator().manual_seed(hash(node_id) % 1000)
swarm = starling.Swarm(node_id=node_id, listen=listen, peers=peers or None,
                       run_id="overhead", insecure=True, min_members=int(n))
rounds = []
with starling.DiLoCo(model, opt, swarm, inner_steps=h,
                     architecture=starling.torchscript_architecture(path)) as d:
    last = time.perf_counter()
    inner = 0.0  # this round's inner steps, the user's code only
    for step in range(steps):
        s0 = time.perf_counter()
        x = torch.randint(0, 256, (batch, context + 1), generator=gen)
        logits = model(x[:, :-1])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=fast)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        t0 = time.perf_counter()
        inner += t0 - s0
        r = d.step(samples=batch)
        if r is not None:
            now = time.perf_counter()
            rounds.append({"seconds": now - last, "round_call": now - t0,
                           "inner_seconds": inner, "steps": h,
                           "outcome": r["outcome"]})
            last = now
            inner = 0.0
print(json.dumps(rounds))
'''


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                os.pardir, "examples", "python"))
from swarm_launch import free_ports  # noqa: E402  (the examples' launcher)


def trace_model(path, context):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import torch
    import starling_models
    torch.manual_seed(0)
    model = starling_models.build(
        "gpt(layers=2,width=64,heads=4,context=%d,vocab=256)" % context)
    traced = torch.jit.trace(model, torch.zeros(2, context, dtype=torch.long))
    traced.save(path)


def run_cxx(a, model, out):
    ports = free_ports(a.members)
    procs = []
    for i in range(a.members):
        args = [a.starling, "node", "--insecure", "--run_id=overhead",
                "--node_id=c%d" % i, "--listen=127.0.0.1:%d" % ports[i],
                "--model=torchscript:%s" % model, "--data=kjv",
                "--context=%d" % a.context, "--batch=%d" % a.batch,
                "--steps=%d" % a.steps, "--inner_steps=%d" % a.inner_steps,
                "--min_members=%d" % a.members, "--linger_seconds=0",
                "--eval_every=0", "--threads=%d" % a.threads,
                "--shard=%d/%d" % (i, a.members), "--out=%s/c%d" % (out, i)]
        if i:
            args.append("--peers=127.0.0.1:%d" % ports[0])
        procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            sys.exit("starling node failed; see %s" % out)
    rounds, rest, step = [], [], []
    for i in range(a.members):
        with open("%s/c%d/events.jsonl" % (out, i)) as f:
            events = [json.loads(l) for l in f]
        rs = [e for e in events if e.get("event") == "round"][1:]
        rounds += [e["seconds"] for e in rs]
        rest += [e["sync_seconds"] + e.get("copy_seconds", 0) +
                 e.get("outer_seconds", 0) for e in rs]
        step += [e["inner_seconds"] / e["inner_steps"] for e in rs]
    return rounds, rest, step


def run_python(a, model, variant):
    ports = free_ports(a.members)
    env = dict(os.environ)
    procs = [subprocess.Popen(
        [sys.executable, "-c", MEMBER_CODE, model, "p%d" % i,
         "127.0.0.1:%d" % ports[i],
         "127.0.0.1:%d" % ports[0] if i else "", str(a.members),
         str(a.steps), str(a.inner_steps), str(a.batch), str(a.context),
         str(a.threads), variant], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env) for i in range(a.members)]
    rounds, rest, step = [], [], []
    for p in procs:
        stdout, _ = p.communicate()
        if p.returncode != 0:
            sys.exit("a Python member failed")
        rs = json.loads(stdout.strip().splitlines()[-1])[1:]
        rounds += [r["seconds"] for r in rs]
        rest += [r["round_call"] for r in rs]
        step += [r["inner_seconds"] / r["steps"] for r in rs]
    return rounds, rest, step


def equal_step(h, cxx_round, cxx_step, py_round, py_step):
    """(H·t_cxx + overhead_py) / (H·t_cxx + overhead_cxx), overhead being a
    side's round less its H inner steps: the Python round with its inner
    steps replaced by the node's, over the node's round."""
    return (h * cxx_step + py_round - h * py_step) / cxx_round


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", default=os.path.join(ROOT, "build",
                                                       "starling"))
    ap.add_argument("--out", default="/tmp/starling-python-overhead")
    ap.add_argument("--members", type=int, default=2)
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--inner_steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--python_variants", default="plain,fast",
                    help="the Python loops to run: plain (AdamW, zero_grad) "
                         "and/or fast (AdamW(foreach=True), "
                         "zero_grad(set_to_none=True))")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = os.path.join(a.out, "gpt.pt")
    trace_model(model, a.context)
    names = {"plain": "python", "fast": "python_fast"}
    variants = [v for v in a.python_variants.split(",") if v]
    sides = ["cxx"] + [names[v] for v in variants]
    res = {side: {"round": [], "rest": [], "step": []} for side in sides}
    for rep in range(a.repeats):
        for side in sides:
            out = os.path.join(a.out, "%s%d" % (side, rep))
            if side == "cxx":
                rounds, rest, step = run_cxx(a, model, out)
            else:
                rounds, rest, step = run_python(
                    a, model, "fast" if side == "python_fast" else "plain")
            res[side]["round"].append(statistics.mean(rounds))
            res[side]["rest"].append(statistics.mean(rest))
            res[side]["step"].append(statistics.mean(step))
    h = a.inner_steps
    summary = {}
    for side, v in res.items():
        round_s = statistics.mean(v["round"])
        step_s = statistics.mean(v["step"])
        summary[side] = {
            "round_seconds": round_s, "round_seconds_runs": v["round"],
            "non_training_seconds": statistics.mean(v["rest"]),
            "non_training_seconds_runs": v["rest"],
            "step_seconds": step_s, "step_seconds_runs": v["step"],
            "overhead_seconds": round_s - h * step_s}
    cxx = summary["cxx"]
    for side in sides[1:]:
        py = summary[side]
        suffix = "" if side == "python" else side[len("python"):]
        summary["ratio_round" + suffix] = (py["round_seconds"] /
                                           cxx["round_seconds"])
        summary["ratio_step" + suffix] = (py["step_seconds"] /
                                          cxx["step_seconds"])
        # Both rounds with the node's inner steps: Starling's part only.
        summary["ratio_round_equal_step" + suffix] = equal_step(
            h, cxx["round_seconds"], cxx["step_seconds"],
            py["round_seconds"], py["step_seconds"])
        # The same per repeat, each from the runs next to each other.
        c, p = res["cxx"], res[side]
        summary["ratio_round_runs" + suffix] = [
            pr / cr for pr, cr in zip(p["round"], c["round"])]
        summary["ratio_round_equal_step_runs" + suffix] = [
            equal_step(h, cr, cs, pr, ps) for cr, cs, pr, ps in
            zip(c["round"], c["step"], p["round"], p["step"])]
    summary["settings"] = {k: getattr(a, k) for k in (
        "members", "steps", "inner_steps", "batch", "context", "threads",
        "repeats", "python_variants")}
    summary["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
