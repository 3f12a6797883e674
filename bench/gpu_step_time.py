#!/usr/bin/env python3
"""Step time of `starling train` against the same gpt in PyTorch eager.

For each --precisions entry (fp32, bf16) it runs, one after the other on
the same device:
  * `starling train --device=DEVICE --precision=P` on a byte-level text
    corpus, reading each inner step's wall time from events.jsonl and its
    GPU memory from summary.json (the CUDA caching allocator's peaks);
  * the same model (core/model.cc's gpt, op for op), optimizer (AdamW with
    Starling's defaults: betas 0.9/0.95, weight decay 0.1), gradient
    clipping (1.0), batch and data in PyTorch eager, in a fresh process,
    timing each step the way Starling does (batch to the device, forward
    under autocast for bf16, fp32 loss, backward, clip, step, loss.item())
    and reading torch.cuda.max_memory_allocated/max_memory_reserved.
The first --warmup_steps steps of each are not timed; the median of the
rest is the step time. Writes --json (and --md, a table). Timings are only
comparable within one run on one machine.

  bench/gpu_step_time.py --starling=build/starling --device=cuda \\
      --json=runs/step_time.json          # the ~100M gpt (12x768, ctx 256)
  bench/gpu_step_time.py --starling=build/starling --device=cpu \\
      --layers=2 --width=64 --heads=4 --context=64 --batch=8 --steps=30 \\
      --json=runs/step_time_cpu.json      # the plumbing, on a CPU

The corpus (--corpus) is made from the repository's own text files when
missing: the step time does not depend on what the bytes say.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS_BYTES = 2 << 20
TEXT_SUFFIXES = (".md", ".cc", ".h", ".py", ".proto", ".sh", ".txt")
SKIP_DIRS = {".git", ".gpu-deps", "runs", "node_modules", "Testing"}


def make_corpus(path):
    """Concatenates the repository's text files (sorted) to CORPUS_BYTES."""
    files = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and
                             not d.startswith("build"))
        files += [os.path.join(dirpath, f) for f in sorted(filenames)
                  if f.endswith(TEXT_SUFFIXES)]
    text = b"".join(open(f, "rb").read() for f in files)
    if not text:
        raise SystemExit(f"gpu_step_time: no text files under {ROOT}")
    data = (text * (CORPUS_BYTES // len(text) + 1))[:CORPUS_BYTES]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def stats(seconds, tokens_per_step):
    seconds = sorted(seconds)
    median = statistics.median(seconds)
    return {
        "steps_timed": len(seconds),
        "median_step_seconds": median,
        "mean_step_seconds": statistics.fmean(seconds),
        "p10_step_seconds": seconds[len(seconds) // 10],
        "p90_step_seconds": seconds[(len(seconds) * 9) // 10],
        "tokens_per_second": tokens_per_step / median,
    }


def run_starling(args, precision, out):
    cmd = [args.starling, "train", f"--device={args.device}",
           f"--precision={precision}", "--model=gpt",
           f"--layers={args.layers}", f"--width={args.width}",
           f"--heads={args.heads}", f"--context={args.context}",
           f"--data=text:{args.corpus}", f"--batch={args.batch}",
           f"--steps={args.steps}", f"--lr={args.lr}", "--warmup=0",
           "--eval_every=0", "--checkpoint_every=0", "--log_every=0",
           "--seed=0", f"--out={out}"]
    if args.threads > 0:
        cmd.append(f"--threads={args.threads}")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    seconds = []
    with open(os.path.join(out, "events.jsonl")) as f:
        for line in f:
            ev = json.loads(line)
            if ev.get("event") == "step" and ev["step"] > args.warmup_steps:
                seconds.append(ev["seconds"])
    summary = json.load(open(os.path.join(out, "summary.json")))
    node = summary["nodes"][0]
    result = stats(seconds, args.batch * args.context)
    result.update(
        command=" ".join(cmd),
        parameters=summary["model"]["parameters"],
        peak_allocated_bytes=node.get("gpu_peak_allocated_bytes"),
        peak_reserved_bytes=node.get("gpu_peak_reserved_bytes"))
    return result


# --- the PyTorch side (a fresh process: --pytorch_worker=JSON) -------------

def pytorch_worker(cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    # The block is Starling's own gpt block's PyTorch twin, shared with
    # `starling export`; only the model around it differs, caching its mask.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    os.pardir, "python"))
    from starling_models import Block

    class Gpt(nn.Module):
        def __init__(self, vocab, context, width, heads, layers):
            super().__init__()
            self.tok_emb = nn.Embedding(vocab, width)
            self.pos_emb = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block(width, heads)
                                        for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab)
            self.mask = None

        def forward(self, x):
            t = x.size(1)
            pos = torch.arange(t, device=x.device)
            h = self.tok_emb(x) + self.pos_emb(pos)
            if self.mask is None or self.mask.size(0) != t:
                self.mask = torch.ones(t, t, dtype=torch.bool,
                                       device=x.device).triu(1)
            for block in self.blocks:
                h = block(h, self.mask)
            return self.head(self.ln_f(h))

    device = torch.device(cfg["device"])
    if cfg["threads"] > 0:
        torch.set_num_threads(cfg["threads"])
    torch.manual_seed(0)
    with open(cfg["corpus"], "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long)
    model = Gpt(256, cfg["context"], cfg["width"], cfg["heads"],
                cfg["layers"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"],
                            betas=(0.9, 0.95), weight_decay=0.1,
                            **({"foreach": False} if cfg["no_foreach"]
                               else {}))
    bf16 = cfg["precision"] == "bf16"
    gen = torch.Generator().manual_seed(0)
    batch, context = cfg["batch"], cfg["context"]
    seconds = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(cfg["steps"]):
        start = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = cfg["lr"]
        at = torch.randint(0, data.numel() - context - 1, (batch,),
                           generator=gen)
        idx = at[:, None] + torch.arange(context + 1)
        window = data[idx]
        x = window[:, :-1].to(device)
        y = window[:, 1:].to(device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)),
                               y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = loss.item()
        if step >= cfg["warmup_steps"]:
            seconds.append(time.perf_counter() - start)
    if not math.isfinite(loss_value):
        raise SystemExit(f"pytorch: the loss is {loss_value}")
    result = stats(seconds, batch * context)
    result.update(
        parameters=sum(p.numel() for p in model.parameters()),
        final_loss=loss_value,
        optimizer=("AdamW(foreach=False)" if cfg["no_foreach"]
                   else "AdamW (PyTorch's default implementation)"),
        peak_allocated_bytes=(torch.cuda.max_memory_allocated(device)
                              if device.type == "cuda" else None),
        peak_reserved_bytes=(torch.cuda.max_memory_reserved(device)
                             if device.type == "cuda" else None))
    print(json.dumps(result))


def run_pytorch(args, precision, no_foreach=False):
    cfg = dict(device=args.device, precision=precision, corpus=args.corpus,
               layers=args.layers, width=args.width, heads=args.heads,
               context=args.context, batch=args.batch, steps=args.steps,
               warmup_steps=args.warmup_steps, lr=args.lr,
               threads=args.threads, no_foreach=no_foreach)
    proc = subprocess.run([args.python, os.path.abspath(__file__),
                           "--pytorch_worker", json.dumps(cfg)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the PyTorch run exited {proc.returncode}:\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def environment(args):
    code = ("import json, torch; d = {'torch': torch.__version__}\n"
            f"if '{args.device}'.startswith('cuda'):\n"
            "    d['gpu'] = torch.cuda.get_device_name(0)\n"
            "print(json.dumps(d))")
    proc = subprocess.run([args.python, "-c", code], capture_output=True,
                          text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def gib(n):
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def markdown(report):
    m = report["model"]
    lines = [
        f"# Step time: starling train vs PyTorch eager ({report['device']}"
        f"{', ' + report['gpu'] if report.get('gpu') else ''})", "",
        f"gpt {m['layers']}x{m['width']}, {m['heads']} heads, context "
        f"{m['context']}, {m['parameters']:,} parameters; batch "
        f"{report['batch']}; median of {report['steps'] - report['warmup_steps']}"
        f" steps after {report['warmup_steps']} untimed; PyTorch "
        f"{report.get('torch', '?')}.", "",
        "| precision | Starling s/step | PyTorch s/step | ratio | Starling "
        "GPU peak (allocated / reserved) | PyTorch GPU peak |",
        "|---|---|---|---|---|---|"]
    for r in report["results"]:
        s, p = r.get("starling"), r.get("pytorch")
        if not s or not p:
            lines.append(f"| {r['precision']} | {r.get('error', 'failed')} |"
                         " | | | |")
            continue
        lines.append(
            f"| {r['precision']} | {s['median_step_seconds']:.4f} | "
            f"{p['median_step_seconds']:.4f} | {r['ratio']:.3f} | "
            f"{gib(s['peak_allocated_bytes'])} / "
            f"{gib(s['peak_reserved_bytes'])} | "
            f"{gib(p['peak_allocated_bytes'])} / "
            f"{gib(p['peak_reserved_bytes'])} |")
    lines += ["", "ratio = Starling / PyTorch (at most 1.0: Starling is as "
              "fast or faster).", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--starling", help="the starling binary (or a wrapper)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup_steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for both (0: each one's default)")
    ap.add_argument("--no_foreach", action="store_true",
                    help="also time PyTorch with AdamW(foreach=False), "
                    "Starling's optimizer's structure (one tensor at a time)")
    ap.add_argument("--corpus", default=None)
    ap.add_argument("--corpus_only", action="store_true",
                    help="write --corpus and exit")
    ap.add_argument("--work", default=None, help="run directories")
    ap.add_argument("--json", default=None)
    ap.add_argument("--md", default=None)
    ap.add_argument("--python", default=sys.executable,
                    help="the Python whose torch runs the PyTorch side")
    ap.add_argument("--pytorch_worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.pytorch_worker:
        pytorch_worker(json.loads(args.pytorch_worker))
        return 0
    work = args.work or tempfile.mkdtemp(prefix="gpu-step-time-")
    args.corpus = os.path.abspath(args.corpus or os.path.join(work,
                                                              "corpus.txt"))
    if not os.path.exists(args.corpus):
        make_corpus(args.corpus)
    if args.corpus_only:
        return 0
    if not args.starling:
        ap.error("--starling is required")
    if args.warmup_steps >= args.steps:
        ap.error("--warmup_steps must be below --steps")
    report = dict(environment(args), device=args.device,
                  command=" ".join(sys.argv), batch=args.batch,
                  steps=args.steps, warmup_steps=args.warmup_steps,
                  model=dict(layers=args.layers, width=args.width,
                             heads=args.heads, context=args.context,
                             vocab=256, parameters=None),
                  results=[])
    failed = False
    for precision in args.precisions.split(","):
        r = {"precision": precision}
        try:
            r["starling"] = run_starling(
                args, precision, os.path.join(work, f"starling-{precision}"))
            r["pytorch"] = run_pytorch(args, precision)
            if args.no_foreach:
                r["pytorch_no_foreach"] = run_pytorch(args, precision, True)
            r["ratio"] = (r["starling"]["median_step_seconds"] /
                          r["pytorch"]["median_step_seconds"])
            report["model"]["parameters"] = r["starling"]["parameters"]
            if r["pytorch"]["parameters"] != r["starling"]["parameters"]:
                raise RuntimeError(
                    f"the models differ: Starling has "
                    f"{r['starling']['parameters']} parameters, PyTorch "
                    f"{r['pytorch']['parameters']}")
            print(f"gpu_step_time: {precision}: starling "
                  f"{r['starling']['median_step_seconds']:.4f} s/step, "
                  f"pytorch {r['pytorch']['median_step_seconds']:.4f} s/step,"
                  f" ratio {r['ratio']:.3f}", file=sys.stderr)
        except Exception as e:  # keep the other precision's figures
            r["error"] = str(e)
            failed = True
            print(f"gpu_step_time: {precision}: {e}", file=sys.stderr)
        report["results"].append(r)
    if report["model"]["parameters"] is None:
        report["model"]["parameters"] = 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    md = markdown(report)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    print(md)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
