#!/usr/bin/env python3
"""End to end: the StatefulSet's own command line, run as 3 local processes.

Reads the container's command, args and env from the rendered cpu overlay
(`kubectl kustomize`; without kubectl, from the base's YAML) and the
flagfile from its ConfigMap, then starts pods starling-0..2 the way the
kubelet would: $(VAR) expanded from the pod's env. Only what a cluster
provides is stood in for:
  - each pod's IP is its own loopback address (127.X.Y.K+1), so the fixed
    ports 7070/7071/9464 of the manifest do not collide;
  - cluster DNS: a hosts file passed with --hosts maps
    starling-K.starling-peers to the pod's address;
  - volumes: the flagfile mount, the PVC (--out) and the cache dir are
    temporary directories;
  - the run is made short (a tiny model, few steps) by flags appended last.
Then checks: the pods form one swarm (rounds with all 3 members), answer
their gRPC readiness probes, serve /metrics, and log JSON; SIGTERM to pod 2
(a scale-down) makes it leave and checkpoint while the others go on; pod 2
started again with the same command line (the PVC kept) resumes, catches up;
a new pod starling-3 (a scale-up) joins through the seeds and fetches the
model; every pod ends on the same model.

Usage: statefulset_e2e_test.py STARLING_BINARY. Exit 0 pass, 1 fail,
77 skip (a tool is missing, unless STARLING_REQUIRE_DEPLOY_TOOLS=1).
"""
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OVERLAY = os.path.join(ROOT, "deploy", "k8s", "overlays", "cpu")
BASE = os.path.join(ROOT, "deploy", "k8s", "base")
REPLICAS = 3
SHORT_RUN = [
    "--steps=3000", "--inner_steps=20", "--model=gpt", "--layers=1",
    "--width=32", "--heads=2", "--context=32", "--batch=8", "--lr=3e-3",
    "--warmup=5", "--threads=1", "--eval_every=0", "--checkpoint_every=100",
    "--suspect_timeout=2", "--round_deadline=20",
]


def skip(why):
    if os.environ.get("STARLING_REQUIRE_DEPLOY_TOOLS") == "1":
        print(f"FAIL: {why} (STARLING_REQUIRE_DEPLOY_TOOLS=1)")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(77)


def fail(why, logs=None):
    print(f"FAIL: {why}")
    for name, path in (logs or {}).items():
        try:
            with open(path) as f:
                print(f"--- {name} (last lines) ---")
                print("".join(f.readlines()[-30:]))
        except OSError:
            pass
    sys.exit(1)


def manifests():
    """The StatefulSet and the flagfile text, rendered when kubectl exists."""
    try:
        import yaml
    except ImportError:
        skip("python3-yaml is not installed (run scripts/setup.sh)")
    if shutil.which("kubectl"):
        text = subprocess.run(["kubectl", "kustomize", OVERLAY], check=True,
                              capture_output=True, text=True).stdout
        docs = [d for d in yaml.safe_load_all(text) if d]
        source = "kubectl kustomize deploy/k8s/overlays/cpu"
    else:
        with open(os.path.join(BASE, "statefulset.yaml")) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        with open(os.path.join(BASE, "node.flags")) as f:
            docs.append({"kind": "ConfigMap", "data": {"node.flags": f.read()}})
        source = "deploy/k8s/base (kubectl not found)"
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    cm = next(d for d in docs if d["kind"] == "ConfigMap"
              and "node.flags" in d.get("data", {}))
    return sts, cm["data"]["node.flags"], source


def expand(arg, env):
    """The kubelet's $(VAR) expansion."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: env.get(m.group(1), m.group(0)), arg)


def free(ip, ports):
    for port in ports:
        s = socket.socket()
        try:
            s.bind((ip, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def events(path, kind=None):
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if kind is None or ev.get("event") == kind:
                    out.append(ev)
    except OSError:
        pass
    return out


def health(address, service, tries=3):
    """grpc.health.v1.Health/Check with python3-grpcio: 1 SERVING,
    2 NOT_SERVING, None when unavailable. Like the kubelet (failureThreshold
    3 in the manifest), a probe that fails is tried again before it counts:
    once, a fresh channel right after the previous probe's failed at once
    (a fresh Debian chroot, 2026-12-06), with the node serving."""
    import grpc
    req = bytes([0x0A, len(service)]) + service.encode()
    for attempt in range(tries):
        if attempt > 0:
            time.sleep(0.5)
        with grpc.insecure_channel(address) as ch:
            check = ch.unary_unary("/grpc.health.v1.Health/Check")
            try:
                resp = check(req, timeout=2)
            except grpc.RpcError as e:
                print(f"note: {service} probe of {address}, try {attempt + 1}: "
                      f"{e.code()}: {e.details()}")
                continue
        return resp[1] if len(resp) >= 2 and resp[0] == 0x08 else 0
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    binary = os.path.abspath(sys.argv[1])
    if shutil.which("bible") is None:
        skip("the `bible` program (bible-kjv) is missing: run scripts/setup.sh")
    sts, flags_text, source = manifests()
    spec = sts["spec"]["template"]["spec"]
    container = next(c for c in spec["containers"] if c["name"] == "starling")
    command, args = container["command"], container["args"]
    if command[0] != "starling":
        fail(f"unexpected entry point {command}")
    ports = [p["containerPort"] for p in container["ports"]]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    print(f"manifests: {source}")
    print(f"entry point: {' '.join(command + args)}")

    work = tempfile.mkdtemp(prefix="starling-e2e-")
    config_dir = os.path.join(work, "config")
    os.makedirs(config_dir)
    with open(os.path.join(config_dir, "node.flags"), "w") as f:
        f.write(flags_text)
    net = None
    for _ in range(20):
        net = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}"
        if all(free(f"{net}.{k + 1}", ports) for k in range(REPLICAS + 1)):
            break
        net = None
    if net is None:
        skip(f"no free loopback addresses for ports {ports}")
    hosts = os.path.join(work, "hosts")
    with open(hosts, "w") as f:
        for k in range(REPLICAS + 1):
            f.write(f"{net}.{k + 1} starling-{k}.starling-peers\n")

    def pod_argv(k):
        env = {"POD_NAME": f"starling-{k}", "POD_NAMESPACE": "default",
               "POD_IP": f"{net}.{k + 1}", "POD_INDEX": str(k)}
        for e in container.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
        data = os.path.join(work, f"pvc-{k}")
        os.makedirs(data, exist_ok=True)
        env["STARLING_CACHE_DIR"] = env.get("STARLING_CACHE_DIR", "").replace(
            mounts["data"], data)
        argv = [binary] + command[1:]
        for a in args:
            a = expand(a, env)
            # Volume mounts: the same paths under the stand-in directories.
            a = a.replace(mounts["config"], config_dir).replace(mounts["data"], data)
            argv.append(a)
        return argv + [f"--hosts={hosts}"] + SHORT_RUN, env, data

    procs, logs = {}, {}

    def start(k):
        argv, env, data = pod_argv(k)
        logs[f"starling-{k}"] = os.path.join(work, f"starling-{k}.log")
        full_env = dict(os.environ)
        full_env.update(env)
        with open(logs[f"starling-{k}"], "a") as log:
            procs[k] = subprocess.Popen(argv, stderr=log, stdout=log,
                                        stdin=subprocess.DEVNULL, env=full_env)
        return data

    try:
        print("pod command (starling-0):", " ".join(pod_argv(0)[0]))
        datas = {k: start(k) for k in range(REPLICAS)}
        ev = {k: os.path.join(datas[k], "run", "events.jsonl") for k in range(REPLICAS)}

        # One swarm: some round has all three members, on every pod.
        deadline = time.time() + 180
        while time.time() < deadline:
            if all(any(len(e.get("members", [])) == REPLICAS
                       for e in events(ev[k], "round")) for k in range(REPLICAS)):
                break
            for k, p in procs.items():
                if p.poll() is not None:
                    fail(f"starling-{k} exited early with {p.returncode}", logs)
            time.sleep(0.2)
        else:
            fail("the pods did not form a 3-member swarm within 180 s", logs)
        print("swarm formed: rounds with starling-0, starling-1, starling-2")

        # Probes and metrics on each pod's address, as the kubelet and
        # Prometheus reach them.
        health_port = next(p["containerPort"] for p in container["ports"]
                           if p["name"] == "health")
        metrics_port = next(p["containerPort"] for p in container["ports"]
                            if p["name"] == "metrics")
        try:
            import grpc  # noqa: F401
            have_grpc = True
        except ImportError:
            have_grpc = False
            if os.environ.get("STARLING_REQUIRE_DEPLOY_TOOLS") == "1":
                fail("python3-grpcio is not installed")
            print("note: python3-grpcio missing; probes not checked")
        for k in range(REPLICAS):
            ip = f"{net}.{k + 1}"
            if have_grpc:
                for service in ("readiness", "liveness"):
                    got = health(f"{ip}:{health_port}", service)
                    if got != 1:
                        fail(f"starling-{k} {service} probe: {got}, want SERVING", logs)
            body = urllib.request.urlopen(
                f"http://{ip}:{metrics_port}/metrics", timeout=5).read().decode()
            if f'node="starling-{k}"' not in body or "starling_inner_steps_total" not in body:
                fail(f"starling-{k} /metrics lacks the node's metrics:\n{body[:2000]}")
        print("probes SERVING and /metrics served on every pod")

        # Scale down: SIGTERM to the highest ordinal.
        victim = REPLICAS - 1
        t0 = time.time()
        procs[victim].send_signal(signal.SIGTERM)
        try:
            procs[victim].wait(timeout=int(spec["terminationGracePeriodSeconds"]))
        except subprocess.TimeoutExpired:
            fail("starling-2 did not leave within terminationGracePeriodSeconds", logs)
        left_after = time.time() - t0
        if not events(ev[victim], "leave"):
            fail("starling-2 exited without a leave event", logs)
        if not os.path.exists(os.path.join(datas[victim], "run", "checkpoint.ckpt")):
            fail("starling-2 left no checkpoint on its volume", logs)
        rounds_at_leave = max(e["round"] for e in events(ev[0], "round"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if max(e["round"] for e in events(ev[0], "round")) >= rounds_at_leave + 2:
                break
            time.sleep(0.2)
        else:
            fail("the remaining pods stopped after starling-2 left", logs)
        print(f"starling-2 left and checkpointed {left_after:.1f} s after SIGTERM; "
              "the others go on")

        # Scale up again: starling-2 with the same command line and volume,
        # and a new pod starling-3 that joins through the seeds.
        start(victim)
        datas[REPLICAS] = start(REPLICAS)
        ev[REPLICAS] = os.path.join(datas[REPLICAS], "run", "events.jsonl")
        for k in range(REPLICAS + 1):
            try:
                code = procs[k].wait(timeout=300)
            except subprocess.TimeoutExpired:
                fail(f"starling-{k} did not finish", logs)
            if code != 0:
                fail(f"starling-{k} exited with {code}", logs)
        if not any(e.get("event") in ("resume",) for e in events(ev[victim])):
            fail("the restarted starling-2 did not resume from its volume", logs)
        if not events(ev[REPLICAS], "state_transfer"):
            fail("the new starling-3 did not fetch the model from the swarm", logs)
        if not any(len(e.get("members", [])) == REPLICAS + 1
                   for e in events(ev[0], "round")):
            fail("no round had all four pods", logs)
        hashes = set()
        for k in range(REPLICAS + 1):
            with open(os.path.join(datas[k], "run", "summary.json")) as f:
                hashes.add(json.load(f)["final"]["model_hash"])
        if len(hashes) != 1:
            fail(f"pods ended on different models: {hashes}", logs)
        # Logs: --log_format=json from the flagfile, one object per line.
        for name, path in logs.items():
            with open(path) as f:
                for line in f:
                    try:
                        obj = json.loads(line)
                    except ValueError:
                        fail(f"{name}: a log line is not JSON: {line!r}", logs)
                    if obj.get("node") != name:
                        fail(f"{name}: log line without its node: {line!r}", logs)
        print("starling-2 resumed, starling-3 joined; all pods finished on model",
              hashes.pop()[:12],
              "with JSON logs; PASS")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        if os.environ.get("STARLING_KEEP_E2E") != "1":
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("kept", work)


if __name__ == "__main__":
    main()
