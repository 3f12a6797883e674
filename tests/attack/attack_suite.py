#!/usr/bin/python3
"""Hostile-peer attack suite (issue 56): aims forged and malformed calls at a
live 3-node `starling sim` and checks that the run does not notice.

For each attack it runs the same seeded sim once clean and once under attack
(the attacker starts once the nodes listen and keeps going for
--attack_seconds) and checks, against the clean run:
  - the run finishes (exit 0) and the members' hashes agree;
  - val_loss within 1%;
  - wall time within 1.5x;
  - at most 100 more log lines per node;
  - peak RSS (VmHWM of the node processes) within 100 MB.
Prints a markdown table; exits 1 if any check failed.

The attacker is a python3-grpcio client built from the repository's protos
(protoc --python_out at run time; it needs no grpc_tools). It has no
credentials: in --mode=tls_token the swarm runs TLS and a join token, the
attacker trusts the CA but knows no token.

  /usr/bin/python3 tests/attack/attack_suite.py --starling build/starling \\
      --out /tmp/attacks [--mode insecure|tls_token] [--attacks a,b,...]
"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

try:
  import grpc
except ImportError:
  print("attack_suite: skipped, no python3-grpcio (scripts/setup.sh)")
  sys.exit(77)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATTEMPTS_PER_ROUND = 1 << 20


def load_protos(tmp):
  out = os.path.join(tmp, "py")
  os.makedirs(out, exist_ok=True)
  subprocess.run(["protoc", "-I", os.path.join(REPO, "protos"),
                  "--python_out=" + out,
                  "starling/peer/v1/peer.proto",
                  "starling/peer/v1/swarm.proto"], check=True)
  sys.path.insert(0, out)
  from starling.peer.v1 import peer_pb2, swarm_pb2  # noqa: E402
  return peer_pb2, swarm_pb2


class Attacker:
  """Forged calls at every node's peer port until stop is set."""

  def __init__(self, pb, spb, addresses, run_id, ca, stop):
    self.pb, self.spb = pb, spb
    self.run_id = run_id
    self.stop = stop
    self.calls = 0
    self.channels = []
    for a in addresses:
      if ca is None:
        ch = grpc.insecure_channel(a)
      else:
        ch = grpc.secure_channel(a, grpc.ssl_channel_credentials(ca),
                                 options=[("grpc.ssl_target_name_override",
                                           "localhost")])
      self.channels.append(ch)

  def control(self, ch, m):
    call = ch.unary_unary("/starling.peer.v1.Swarm/Control",
                          request_serializer=self.spb.ControlMessage.SerializeToString,
                          response_deserializer=self.spb.ControlAck.FromString)
    try:
      call(m, timeout=2)
    except grpc.RpcError:
      pass
    self.calls += 1

  def chunks(self, ch, chunks):
    call = ch.stream_unary("/starling.peer.v1.Peer/SendChunks",
                           request_serializer=self.pb.TensorChunk.SerializeToString,
                           response_deserializer=self.pb.SendAck.FromString)
    try:
      call(iter(chunks), timeout=5)
    except grpc.RpcError:
      pass
    self.calls += 1

  def msg(self, kind, sender, rnd, attempt=0):
    C = self.spb.ControlMessage
    return C(run_id=self.run_id, kind=kind, round=rnd, attempt=attempt,
             lineage="", token=random.getrandbits(64), **{"from": sender})

  # --- the attacks; each is one pass, repeated until stop ---

  def early_chunks(self):
    # Chunks of attempts up to 4 rounds ahead, claiming each rank, of a
    # tensor nobody sends: before, each blamed the rank it claimed.
    for ch in self.channels:
      for ahead in range(0, 40):
        c = self.pb.TensorChunk(run_id=self.run_id, from_rank=ahead % 3,
                                round=ahead * ATTEMPTS_PER_ROUND + 1,
                                tensor="bogus", phase=1, step=0, segment=0,
                                total_elements=10, segment_bytes=40, offset=0,
                                data=b"\0" * 40, plan=random.getrandbits(64))
        self.chunks(ch, [c])

  def early_fill(self):
    # Large early messages of a plausible tensor: before, held up to 1 GiB.
    data = os.urandom(512 * 1024)
    for ch in self.channels:
      for ahead in range(1, 20):
        c = self.pb.TensorChunk(run_id=self.run_id, from_rank=ahead % 3,
                                round=ahead * ATTEMPTS_PER_ROUND,
                                tensor="pseudo_grad", phase=1, step=0,
                                segment=0, total_elements=1 << 20,
                                segment_bytes=len(data), offset=0, data=data,
                                plan=random.getrandbits(64))
        self.chunks(ch, [c])

  def stale_burst(self):
    # STALE "from the coordinator" for every round: before, each cost a redo.
    C = self.spb.ControlMessage
    for ch in self.channels:
      for r in range(0, 30):
        self.control(ch, self.msg(C.STALE, "n0", r))

  def ready_as_coordinator(self):
    # READY far ahead under the coordinator's own id and a member's: before,
    # the coordinator moved to round 1000.
    C = self.spb.ControlMessage
    for ch in self.channels:
      for who in ("n0", "n1", "n2"):
        self.control(ch, self.msg(C.READY, who, 1000))

  def forged_plan_commit(self):
    # PLANs, COMMITs, ABORTs under the coordinator's id, DONE and FAILED
    # under the members'.
    C = self.spb.ControlMessage
    for ch in self.channels:
      for r in range(0, 30):
        p = self.msg(C.PLAN, "n0", r, attempt=500000)
        p.members.extend(["n1"])
        p.addresses.extend(["127.0.0.1:1"])
        self.control(ch, p)
        self.control(ch, self.msg(C.COMMIT, "n0", r, attempt=1))
        self.control(ch, self.msg(C.ABORT, "n0", r, attempt=1))
        self.control(ch, self.msg(C.DONE, "n1", r, attempt=1))
        f = self.msg(C.FAILED, "n2", r, attempt=1)
        f.culprit = "n1"
        self.control(ch, f)

  def refusal_flood(self):
    # Calls refused for many reasons: before, each logged a line.
    C = self.spb.ControlMessage
    for ch in self.channels:
      self.control(ch, self.msg(C.READY, "n1", 1 << 62))
      self.control(ch, self.msg(99, "n1", 0))
      self.control(ch, self.msg(C.READY, "ghost%d" % random.getrandbits(16), 0))
      self.chunks(ch, [self.pb.TensorChunk(run_id=self.run_id, from_rank=7,
                                           round=0, tensor="pseudo_grad")])

  def run(self, name):
    fn = getattr(self, name)
    while not self.stop.is_set():
      fn()


ATTACKS = ["early_chunks", "early_fill", "stale_burst", "ready_as_coordinator",
           "forged_plan_commit", "refusal_flood"]


def write_corpus(path):
  rnd = random.Random(7)
  words = ["the", "swarm", "trains", "a", "model", "of", "words", "and",
           "every", "node", "sends", "its", "round", "to", "peers", "while",
           "gossip", "carries", "news", "slowly", "over", "links"]
  text, size = [], 0
  while size < 300000:
    text.append(rnd.choice(words))
    size += len(text[-1]) + 1
  with open(path, "w") as f:
    f.write(" ".join(text))


def make_tls(d):
  sh = lambda c: subprocess.run(c, shell=True, cwd=d, check=True,
                                capture_output=True)
  sh("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
     "-nodes -days 2 -subj /CN=ca -keyout ca.key -out ca.pem")
  sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
     "-subj /CN=node -keyout node.key -out node.csr")
  with open(os.path.join(d, "node.ext"), "w") as f:
    f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
  sh("openssl x509 -req -days 2 -in node.csr -CA ca.pem -CAkey ca.key "
     "-CAcreateserial -extfile node.ext -out node.pem")
  with open(os.path.join(d, "swarm.token"), "w") as f:
    f.write("%032x" % random.getrandbits(128))
  os.chmod(os.path.join(d, "swarm.token"), 0o600)
  return ("--tls_cert=%s/node.pem --tls_key=%s/node.key --tls_ca=%s/ca.pem "
          "--join_token_file=%s/swarm.token" % (d, d, d, d)).split()


def node_pids(out):
  pids = []
  for p in os.listdir("/proc"):
    if not p.isdigit():
      continue
    try:
      with open("/proc/%s/cmdline" % p, "rb") as f:
        cmd = f.read().split(b"\0")
    except OSError:
      continue
    if len(cmd) > 1 and cmd[1] == b"node" and any(
        a.startswith(b"--out=" + out.encode()) for a in cmd):
      pids.append(p)
  return pids


def hwm_mb(pid):
  try:
    with open("/proc/%s/status" % pid) as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 1024.0
  except OSError:
    pass
  return 0.0


def addresses(out, n):
  found = {}
  for i in range(n):
    try:
      with open(os.path.join(out, "n%d" % i, "node.log")) as f:
        m = re.search(r"listening on (\S+)", f.read())
      if m:
        found[i] = m.group(1).rstrip(",")
    except OSError:
      pass
  return [found[i] for i in range(n)] if len(found) == n else None


def run_sim(args, flags, out, attack, pb, spb, ca):
  cmd = [args.starling, "sim"] + flags + ["--out=" + out]
  t0 = time.time()
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  peak = {}
  stop = threading.Event()
  threads = []
  attacker = None
  attack_end = None
  while proc.poll() is None:
    for p in node_pids(out):
      peak[p] = max(peak.get(p, 0.0), hwm_mb(p))
    if attack and attacker is None:
      addr = addresses(out, 3)
      if addr:
        attacker = Attacker(pb, spb, addr, "attack", ca, stop)
        for _ in range(4):
          t = threading.Thread(target=attacker.run, args=(attack,), daemon=True)
          t.start()
          threads.append(t)
        attack_end = time.time() + args.attack_seconds
    if attack_end is not None and time.time() > attack_end and not stop.is_set():
      stop.set()
    time.sleep(0.3)
  stop.set()
  for t in threads:
    t.join(timeout=10)
  wall = time.time() - t0
  _, err = proc.communicate()
  res = {"rc": proc.returncode, "wall": wall,
         "rss": max(peak.values()) if peak else 0.0,
         "calls": attacker.calls if attacker else 0, "lines": {}}
  try:
    with open(os.path.join(out, "summary.json")) as f:
      fin = json.load(f)["final"]
    res["val"] = fin.get("val_loss")
    res["agree"] = bool(fin.get("all_hashes_agree"))
  except (OSError, KeyError, ValueError):
    res["val"], res["agree"] = None, False
    res["err"] = err.decode(errors="replace")[-2000:]
  for i in range(3):
    try:
      with open(os.path.join(out, "n%d" % i, "node.log")) as f:
        res["lines"]["n%d" % i] = sum(1 for _ in f)
    except OSError:
      res["lines"]["n%d" % i] = 0
  return res


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--starling", required=True)
  ap.add_argument("--out", required=True)
  ap.add_argument("--mode", default="insecure", choices=["insecure", "tls_token"])
  ap.add_argument("--attacks", default=",".join(ATTACKS))
  ap.add_argument("--attack_seconds", type=float, default=20)
  ap.add_argument("--steps", type=int, default=600)
  args = ap.parse_args()
  os.makedirs(args.out, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=args.out)
  pb, spb = load_protos(tmp)
  corpus = os.path.join(tmp, "corpus.txt")
  write_corpus(corpus)
  flags = ("--nodes=3 --steps=%d --inner_steps=50 --eval_every=0 --seed=1 "
           "--run_id=attack --data=text:%s --model=gpt --layers=1 --width=32 "
           "--heads=2 --context=32 --batch=8 --lr=3e-3 --warmup=5"
           % (args.steps, corpus)).split()
  ca = None
  if args.mode == "tls_token":
    flags += make_tls(tmp)
    with open(os.path.join(tmp, "ca.pem"), "rb") as f:
      ca = f.read()
  clean = run_sim(args, flags, os.path.join(args.out, args.mode + "-clean"),
                  None, pb, spb, ca)
  print("clean (%s): rc %d, val %s, %.1f s, peak RSS %.0f MB, lines %s"
        % (args.mode, clean["rc"], clean["val"], clean["wall"], clean["rss"],
           clean["lines"]), flush=True)
  if clean["rc"] != 0 or clean["val"] is None:
    print(clean.get("err", ""))
    return 1
  rows = []
  ok_all = True
  for attack in args.attacks.split(","):
    r = run_sim(args, flags, os.path.join(args.out, args.mode + "-" + attack),
                attack, pb, spb, ca)
    extra = max(r["lines"][n] - clean["lines"][n] for n in r["lines"])
    checks = {
        "finished": r["rc"] == 0,
        "hashes": r["agree"],
        "val": r["val"] is not None and abs(r["val"] / clean["val"] - 1) <= 0.01,
        "wall": r["wall"] <= 1.5 * clean["wall"],
        "log": extra <= 100,
        "rss": r["rss"] <= clean["rss"] + 100,
    }
    ok = all(checks.values())
    ok_all &= ok
    val = ("%.4f (%+.2f%%)" % (r["val"], 100 * (r["val"] / clean["val"] - 1))
           if r["val"] is not None else "-")
    failed = ",".join(k for k, v in checks.items() if not v)
    rows.append("| %s | %s | %d | %d | %s | %s | %.2fx | %d | %+.0f MB | %s |"
                % (args.mode, attack, r["calls"], r["rc"], r["agree"], val,
                   r["wall"] / clean["wall"], extra, r["rss"] - clean["rss"],
                   "ok" if ok else "FAIL: " + failed))
    print(rows[-1], flush=True)
    if r.get("err"):
      print(r["err"])
  print("\n| mode | attack | calls | rc | hashes agree | val_loss (vs clean) "
        "| wall vs clean | extra log lines (max node) | peak RSS vs clean | result |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  print("\n".join(rows))
  return 0 if ok_all else 1


if __name__ == "__main__":
  sys.exit(main())
