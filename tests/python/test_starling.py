"""Tests of the `starling` Python module (label python; run by ctest with
PYTHONPATH=build/python and STARLING_BINARY=build/starling)."""
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import starling

HERE = os.path.dirname(os.path.abspath(__file__))
MEMBER = os.path.join(HERE, "swarm_member.py")
BINARY = os.environ.get("STARLING_BINARY", "")


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def cli_error(*flags):
    """What `starling node` prints for these flags (exit code 2)."""
    if not BINARY:
        pytest.skip("STARLING_BINARY is not set")
    p = subprocess.run([BINARY, "node", *flags], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    return p.stderr


# ---------------------------------------------------------------------------
# API and errors

def test_api_names():
    for name in ("Swarm", "DiLoCo", "SwarmError", "architecture_of"):
        assert hasattr(starling, name)
    assert issubclass(starling.SwarmError, RuntimeError)


def test_unknown_keyword_is_value_error():
    with pytest.raises(ValueError, match="unknown keyword 'no_such_flag'"):
        starling.Swarm(listen="127.0.0.1:7001", insecure=True,
                       no_such_flag=1)


def test_transport_security_required_like_the_cli():
    with pytest.raises(ValueError) as e:
        starling.Swarm(node_id="a", listen="127.0.0.1:7001")
    assert "--insecure" in str(e.value)
    assert str(e.value) in cli_error("--node_id=a", "--listen=127.0.0.1:7001")


def test_bad_compression_carries_the_cli_message():
    swarm = starling.Swarm(node_id="a", listen="127.0.0.1:7001",
                           insecure=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError) as e:
        starling.DiLoCo(model, opt, swarm, compression="int3")
    assert "int3" in str(e.value)
    assert str(e.value) in cli_error("--insecure", "--listen=127.0.0.1:7001",
                                     "--compression=int3")


def test_bad_inner_steps_names_the_flag():
    swarm = starling.Swarm(listen="127.0.0.1:7001", insecure=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="--inner_steps"):
        starling.DiLoCo(model, opt, swarm, inner_steps=0)


def test_bad_listen_address_is_value_error():
    swarm = starling.Swarm(listen="nonsense", insecure=True)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="--listen=nonsense"):
        with starling.DiLoCo(model, opt, swarm):
            pass


def test_non_float32_parameters_are_refused():
    swarm = starling.Swarm(listen="127.0.0.1:%d" % free_ports(1)[0],
                           insecure=True)
    model = torch.nn.Linear(4, 2).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="parameter weight is Double"):
        with starling.DiLoCo(model, opt, swarm):
            pass


def test_architecture_is_a_digest_of_names_shapes_and_dtypes():
    a = starling.architecture_of(torch.nn.Linear(4, 2))
    assert a.startswith("python(") and len(a) == len("python()") + 16
    assert a == starling.architecture_of(torch.nn.Linear(4, 2))
    assert a != starling.architecture_of(torch.nn.Linear(4, 3))


def test_step_outside_the_block_raises():
    swarm = starling.Swarm(listen="127.0.0.1:7001", insecure=True)
    model = torch.nn.Linear(4, 2)
    d = starling.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1),
                        swarm)
    with pytest.raises(RuntimeError, match="outside its `with` block"):
        d.step()


def test_alone_a_round_is_the_outer_step_and_writes_the_model():
    port = free_ports(1)[0]
    swarm = starling.Swarm(node_id="solo", listen="127.0.0.1:%d" % port,
                           insecure=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    start = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    weight = model.weight  # the same tensor must be written in place
    with starling.DiLoCo(model, opt, swarm, inner_steps=2, outer_lr=1.0,
                         outer_momentum=0.0) as d:
        h0 = d.model_hash
        trained = None
        for i in range(2):
            loss = model(torch.ones(3, 4)).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            trained = model.weight.detach().clone()
            r = d.step()
        assert r["outcome"] == "committed" and r["members"] == 1
        assert r["round"] == 1 and d.round == 1
        assert r["model_hash"] != h0
    # Alone, with outer lr 1 and no momentum, θ_global becomes the trained θ
    # (θ0 − (θ0 − θ1) in fp32: equal up to rounding).
    assert model.weight is weight
    assert torch.allclose(model.weight.detach(), trained, rtol=0, atol=1e-6)
    assert not torch.equal(trained, start)


# ---------------------------------------------------------------------------
# Checkpoints and resume: the node's --out, --checkpoint_every, --resume

def train_alone(run_dir, rounds, model, opt, **flags):
    """Trains `model` alone for `rounds` rounds of 2 steps, with out=run_dir;
    returns (round, model_hash, resumed) as the `with` block left them."""
    port = free_ports(1)[0]
    swarm = starling.Swarm(node_id="solo", listen="127.0.0.1:%d" % port,
                           insecure=True)
    with starling.DiLoCo(model, opt, swarm, inner_steps=2, outer_lr=0.7,
                         outer_momentum=0.9, compression="int8",
                         out=str(run_dir), **flags) as d:
        until = d.round + rounds
        k = 0
        while d.round < until:
            # The data of step k of round r, whichever call trains it.
            gen = torch.Generator().manual_seed(10 * d.round + k % 2)
            k += 1
            loss = model(torch.randn(8, 4, generator=gen)).pow(2).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            d.step()
        return d.round, d.model_hash, d.resumed


def linear(seed, out=2):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, out)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_a_member_resumes_where_its_checkpoint_left_it(tmp_path):
    run = tmp_path / "run"
    model, opt = linear(0)
    assert train_alone(run, 2, model, opt)[::2] == (2, False)
    saved = model.weight.detach().clone()  # θ_global less the int8 residual
    model, opt = linear(0)
    r, h, _ = train_alone(run, 0, model, opt, resume=True)
    assert r == 2 and torch.equal(model.weight.detach(), saved)
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    assert exp_avg.abs().sum() > 0  # the inner optimizer's state came back
    # A fresh model (another seed) and optimizer take all of it.
    model, opt = linear(5)
    assert not torch.equal(model.weight.detach(), saved)
    r2, h2, resumed = train_alone(run, 1, model, opt, resume_if_exists=True)
    assert resumed and r2 == 3 and h2 != h
    # ... and went on from it: the same as a run never interrupted.
    model, opt = linear(0)
    assert train_alone(tmp_path / "straight", 3, model, opt)[1] == h2


def test_checkpoint_errors_are_the_clis(tmp_path):
    def start(model=None, **flags):
        model = model or torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        swarm = starling.Swarm(node_id="a", insecure=True,
                               listen="127.0.0.1:%d" % free_ports(1)[0])
        with starling.DiLoCo(model, opt, swarm, **flags):
            pass

    with pytest.raises(ValueError, match="--resume needs --out=DIR") as e:
        start(resume=True)
    if BINARY:
        assert str(e.value) in cli_error("--insecure", "--resume")
    with pytest.raises(ValueError, match="--resume: no checkpoint at .*empty"):
        start(resume=True, out=str(tmp_path / "empty"))
    model, opt = linear(0)
    train_alone(tmp_path / "run", 1, model, opt)
    with pytest.raises(ValueError, match="already holds a run .*pass --resume"):
        start(out=str(tmp_path / "run"))
    with pytest.raises(starling.SwarmError,
                       match="holds model python.*weight is float32\\[2,4\\] "
                             "at the checkpoint, float32\\[3,4\\]"):
        start(model=torch.nn.Linear(4, 3), out=str(tmp_path / "run"),
              resume=True)
    if BINARY:  # `starling export` cannot rebuild a Python program's model
        p = subprocess.run([BINARY, "export", "--from=%s" % (tmp_path / "run"),
                            "--out=%s" % (tmp_path / "x.pt")],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "written by the Python module" in p.stderr


def test_kill_9_then_resume_from_the_checkpoint_rejoins_the_swarm(tmp_path):
    out = tmp_path / "p2"
    # The first two train until stopped, as in the late-member test.
    procs = start_members(3, rounds=400, extra=["--step_sleep=0.05"],
                          per_member=[[], [], ["--out=%s" % out]])
    victim = procs[2]
    seen = []
    for line in victim.stdout:  # two rounds committed (and checkpointed)
        seen.append(json.loads(line))
        if seen[-1].get("outcome") == "committed" and seen[-1]["round"] == 2:
            break
    victim.kill()
    victim.communicate()
    listen = victim.args[3]  # the same --listen, --node_id and --out
    seed = procs[0].args[3].replace("--listen=", "--peers=")
    restarted = subprocess.Popen(
        [sys.executable, MEMBER, "--node_id=p2", listen, seed, "--rounds=2", "--step_sleep=0.05", "--data_seed=2",
         "--out=%s" % out],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    [(rc, lines, stderr)] = results([restarted])
    for p in procs[:2]:
        p.send_signal(signal.SIGINT)
    survivors = results(procs[:2])
    assert all(rc in (0, 130) for rc, _, _ in survivors), survivors
    first = [l for _, l, _ in survivors]
    assert rc == 0, stderr
    assert lines[0]["resumed"] and lines[0]["round"] in (2, 3), lines
    committed = [l for l in lines if l.get("outcome") == "committed"]
    assert len(committed) == 2 and all(l["members"] == 3 for l in committed)
    swarm = {l["round"]: l["model_hash"] for l in first[0]
             if l.get("outcome") == "committed"}
    # It resumed the swarm's model of that round, and its rounds since are
    # the swarm's, bit for bit.
    assert swarm[lines[0]["round"]] == lines[0]["model_hash"]
    for l in committed:
        assert swarm[l["round"]] == l["model_hash"], (lines, first[0])


# ---------------------------------------------------------------------------
# Metrics and health: the node's --metrics_port and --health_port

def scrape(address):
    import urllib.request
    with urllib.request.urlopen("http://%s/metrics" % address,
                                timeout=10) as r:
        return r.read().decode()


def sample(text, series):
    """The value of `series` (name and labels, as exposed), or None."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def health(address, service):
    """grpc.health.v1.Health/Check's status: 1 SERVING, 2 NOT_SERVING."""
    import grpc
    with grpc.insecure_channel(address) as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda s: b"\x0a" + bytes([len(s)]) +
            s.encode(),
            response_deserializer=lambda b: b)
        reply = check(service, timeout=10)
    return reply[1] if len(reply) == 2 and reply[0] == 0x08 else 0


def test_metrics_and_health_of_a_running_python_member():
    procs = start_members(2, rounds=400, extra=["--step_sleep=0.05"],
                          per_member=[["--metrics_port=0", "--health_port=0"],
                                      []])
    try:
        first = json.loads(procs[0].stdout.readline())
        assert first["metrics"] and first["health"], first
        assert health(first["health"], "readiness") == 1
        assert health(first["health"], "liveness") == 1
        committed = 'starling_rounds_total{result="committed"}'
        before = sample(scrape(first["metrics"]), committed)
        deadline = time.time() + 120
        while True:  # rounds commit while we watch
            text = scrape(first["metrics"])
            now = sample(text, committed)
            if now is not None and before is not None and now >= before + 2:
                break
            assert time.time() < deadline, text
            time.sleep(0.2)
        assert sample(text, "starling_inner_steps_total") >= 5 * now
        assert sample(text, "starling_peers_connected") == 1
        assert sample(text, "starling_sent_bytes_total") > 0
        assert 0 < sample(text, "starling_train_loss") < 10
        assert "starling_round_duration_seconds_bucket" in text
        [info] = [l for l in text.splitlines()
                  if l.startswith("starling_build_info{")]
        assert 'algo="diloco"' in info and 'node="p0"' in info, info
    finally:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.communicate(timeout=120)


def test_bad_health_port_is_the_clis_value_error():
    model = torch.nn.Linear(4, 2)
    swarm = starling.Swarm(node_id="a", insecure=True,
                           listen="127.0.0.1:%d" % free_ports(1)[0])
    d = starling.DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1),
                        swarm, health_port=70000)
    with pytest.raises(ValueError) as e:
        d.start()
    assert "--health_port=70000: expected a port" in str(e.value)
    if BINARY:
        assert str(e.value) in cli_error("--insecure", "--health_port=70000")


# ---------------------------------------------------------------------------
# Import errors

def run_import(fake_torch_source):
    """`import starling` with a fake torch package ahead on the path."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "torch"))
        with open(os.path.join(tmp, "torch", "__init__.py"), "w") as f:
            f.write(fake_torch_source)
        build_python = os.path.dirname(os.path.dirname(starling.__file__))
        env = dict(os.environ,
                   PYTHONPATH=os.pathsep.join([tmp, build_python]))
        return subprocess.run([sys.executable, "-c", "import starling"],
                              env=env, capture_output=True, text=True,
                              timeout=60)


def test_import_without_torch_says_so():
    p = run_import("raise ImportError('No module named torch')")
    assert p.returncode != 0
    assert "starling needs PyTorch" in p.stderr


def test_import_with_another_torch_version_says_so():
    p = run_import("__version__ = '0.0.1'\n__file__ = 'elsewhere'\n")
    assert p.returncode != 0
    assert "starling was built against torch %s" % torch.__version__ \
        in p.stderr
    assert "imports torch 0.0.1" in p.stderr


# ---------------------------------------------------------------------------
# Swarms of Python members

def start_members(n, rounds, extra=(), widths=None, per_member=None):
    ports = free_ports(n)
    procs = []
    for i in range(n):
        args = [sys.executable, MEMBER, "--node_id=p%d" % i,
                "--listen=127.0.0.1:%d" % ports[i],
                "--rounds=%d" % rounds, "--min_members=%d" % n,
                "--data_seed=%d" % i, *extra]
        if widths:
            args.append("--width=%d" % widths[i])
        if per_member:
            args += per_member[i]
        if i > 0:
            args.append("--peers=127.0.0.1:%d" % ports[0])
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def results(procs, timeout=240):
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append((p.returncode, [json.loads(l) for l in stdout.splitlines()
                                   if l.startswith("{")], stderr))
    return out


@pytest.mark.parametrize("compression", ["fp32", "int8"])
def test_three_python_members_stay_identical(compression):
    procs = start_members(3, rounds=3,
                          extra=["--compression=%s" % compression])
    res = results(procs)
    by_round = []
    for rc, lines, stderr in res:
        assert rc == 0, stderr
        committed = [l for l in lines if l.get("outcome") == "committed"]
        assert [l["round"] for l in committed] == [1, 2, 3], lines
        assert all(l["members"] == 3 for l in committed), lines
        if compression == "fp32":  # no residual: the model is θ_global
            assert all(l["tensors_hash"] == l["model_hash"]
                       for l in committed), lines
        by_round.append([l["model_hash"] for l in committed])
        assert lines[-1]["done"]
    assert by_round[0] == by_round[1] == by_round[2]
    initial = res[0][1][0]["model_hash"]
    assert by_round[0][0] != initial  # the rounds moved the model


def test_kill_9_of_a_python_member_mid_run_the_survivors_finish():
    procs = start_members(3, rounds=4, extra=["--step_sleep=0.05"])
    victim = procs[2]
    for line in victim.stdout:  # its first round committed: now mid-run
        if '"committed"' in line:
            break
    victim.kill()
    victim.communicate()
    by_round = []
    for rc, lines, stderr in results(procs[:2], timeout=300):
        assert rc == 0, stderr
        committed = [l for l in lines if l.get("outcome") == "committed"]
        assert [l["round"] for l in committed] == [1, 2, 3, 4], lines
        assert committed[-1]["members"] == 2, lines
        by_round.append([l["model_hash"] for l in committed])
    assert by_round[0] == by_round[1]


def test_ctrl_c_leaves_the_swarm_with_a_goodbye():
    procs = start_members(2, rounds=4, extra=["--step_sleep=0.05"])
    victim = procs[1]
    for line in victim.stdout:  # its first round committed: now mid-run
        if '"committed"' in line:
            break
    victim.send_signal(signal.SIGINT)
    out, err = victim.communicate(timeout=120)
    assert victim.returncode == 130, err
    assert '"interrupted": true' in out
    [(rc, lines, stderr)] = results(procs[:1])
    assert rc == 0, stderr
    committed = [l for l in lines if l.get("outcome") == "committed"]
    assert [l["round"] for l in committed] == [1, 2, 3, 4], lines
    assert committed[-1]["members"] == 1, lines
    # A goodbye, not the failure detector's verdict.
    assert committed[-1]["peers"]["p1"] == "left", lines


def test_a_late_python_member_catches_up_and_joins_the_rounds():
    ports = free_ports(3)
    # The first two train far longer than the test needs (they are stopped
    # with Ctrl-C once the late member is done), so that however slowly the
    # late member starts and catches up, they are still there to meet it.
    procs = start_members(2, rounds=400, extra=["--step_sleep=0.05"])
    first = procs[0]
    # procs[0] listens on the first port start_members chose; ask it.
    for line in first.stdout:
        if '"address"' in line:
            seed = json.loads(line)["address"]
            break
    first_lines = []
    for line in first.stdout:  # a round committed without the joiner
        first_lines.append(json.loads(line))
        if '"committed"' in line:
            break
    late = subprocess.Popen(
        [sys.executable, MEMBER, "--node_id=p9",
         "--listen=127.0.0.1:%d" % ports[2], "--peers=" + seed,
         "--rounds=2", "--step_sleep=0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    [(rc, lines, stderr)] = results([late])
    assert rc == 0, stderr
    rounds = [l for l in lines if "outcome" in l]
    assert rounds[0]["outcome"] == "caught_up", lines
    committed = [l for l in rounds if l["outcome"] == "committed"]
    assert len(committed) == 2 and all(l["members"] == 3 for l in committed)
    for p in procs:
        p.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=240)
    assert first.returncode in (0, 130), err  # 130: left on Ctrl-C
    procs[1].communicate(timeout=240)
    first_lines += [json.loads(l) for l in out.splitlines()
                    if l.startswith("{")]
    swarm = {l["round"]: l["model_hash"] for l in first_lines
             if l.get("outcome") == "committed"}
    for l in committed:  # the joiner's rounds are the swarm's
        assert swarm[l["round"]] == l["model_hash"], (lines, first_lines)


def test_a_member_with_another_model_is_refused_naming_the_tensor():
    procs = start_members(2, rounds=1, widths=[16, 12],
                          extra=["--inner_steps=2"])
    p0, p1 = procs
    _, err1 = p1.communicate(timeout=120)
    p0.kill()
    p0.communicate()
    assert p1.returncode != 0
    assert "SwarmError" in err1
    assert "0.weight" in err1 and "float32[16,8]" in err1 and \
        "float32[12,8]" in err1, err1


# ---------------------------------------------------------------------------
# A mixed swarm: Python members and `starling node` members

FIXTURES = os.environ.get("STARLING_FIXTURES", "")


def test_python_and_cxx_members_share_rounds_bit_identically(tmp_path):
    model = os.path.join(FIXTURES, "byte_bn.pt")  # has BatchNorm buffers
    if not BINARY or not os.path.exists(model):
        pytest.skip("needs STARLING_BINARY and STARLING_FIXTURES/byte_bn.pt")
    ports = free_ports(4)
    seed = "127.0.0.1:%d" % ports[0]
    cxx = []
    for i in range(2):
        args = [BINARY, "node", "--insecure", "--run_id=pytest",
                "--node_id=c%d" % i, "--listen=127.0.0.1:%d" % ports[i],
                "--model=torchscript:%s" % model, "--data=kjv",
                "--context=16", "--batch=4", "--steps=15",
                "--inner_steps=5", "--min_members=4", "--outer_lr=0.7",
                "--outer_momentum=0.9", "--linger_seconds=0",
                "--shard=%d/2" % i, "--out=%s" % (tmp_path / ("c%d" % i))]
        if i:
            args.append("--peers=" + seed)
        cxx.append(subprocess.Popen(args, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True))
    py = []
    for i in range(2):
        py.append(subprocess.Popen(
            [sys.executable, MEMBER, "--node_id=p%d" % i,
             "--listen=127.0.0.1:%d" % ports[2 + i], "--peers=" + seed,
             "--rounds=3", "--inner_steps=5", "--min_members=4",
             "--data_seed=%d" % i, "--torchscript=%s" % model],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    hashes, tensors = [], []
    py_results = results(py)
    cxx_err = []
    for p in cxx:
        if py_results[0][0] != 0:
            p.kill()
        cxx_err.append(p.communicate(timeout=240)[1])
    for rc, lines, stderr in py_results:
        assert rc == 0, stderr + "\n".join(cxx_err)
        committed = [l for l in lines if l.get("outcome") == "committed"]
        assert all(l["members"] == 4 for l in committed), lines
        tensors.append([l["tensors_hash"] for l in committed])
        hashes.append([l["model_hash"] for l in committed])
    for i, p in enumerate(cxx):
        assert p.returncode == 0, cxx_err[i]
        events = [json.loads(l) for l in
                  (tmp_path / ("c%d" % i) / "events.jsonl").read_text()
                  .splitlines()]
        hashes.append([e["model_hash"] for e in events
                       if e.get("event") == "round"])
    assert len(hashes[0]) == 3
    assert hashes[0] == hashes[1] == hashes[2] == hashes[3], hashes
    # The Python members' own tensors agree too. (Not with model_hash: that
    # hashes the buffers' exact mean, which the integer num_batches_tracked
    # holds rounded, as in the C++ node.)
    assert tensors[0] == tensors[1]
    # A node's checkpoint is the node's to resume, not a Python member's.
    m = torch.jit.load(model)
    swarm = starling.Swarm(node_id="x", insecure=True,
                           listen="127.0.0.1:%d" % free_ports(1)[0])
    d = starling.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), swarm,
                        out=str(tmp_path / "c0"), resume=True,
                        architecture=starling.torchscript_architecture(model))
    with pytest.raises(starling.SwarmError, match="is a starling node's"):
        d.start()


# ---------------------------------------------------------------------------
# starling.Gossip: push-sum from the user's loop (node/embedded_gossip.h)

def small_linear(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def gossip_swarm(node_id="a", **flags):
    return starling.Swarm(node_id=node_id, insecure=True, run_id="gossip",
                          listen="127.0.0.1:%d" % free_ports(1)[0], **flags)


def test_gossip_bad_arguments_are_the_clis_value_errors(tmp_path):
    assert "Gossip" in starling.__all__
    model, opt = small_linear()
    with pytest.raises(ValueError) as e:
        starling.Gossip(model, opt, gossip_swarm(), gossip_momentum=1.5)
    assert "--gossip_momentum=1.5: must be in [0, 1)" in str(e.value)
    if BINARY:
        assert str(e.value) in cli_error("--insecure", "--algo=gossip",
                                         "--gossip_momentum=1.5")
    # Checked where the node checks it: when the member starts.
    g = starling.Gossip(model, opt, gossip_swarm(), gossip_peers="ring")
    with pytest.raises(ValueError) as e:
        g.start()
    assert "--gossip_peers=ring: expected random or exponential" in \
        str(e.value)
    if BINARY:
        assert str(e.value) in cli_error(
            "--insecure", "--algo=gossip", "--gossip_peers=ring", "--steps=1",
            "--listen=127.0.0.1:%d" % free_ports(1)[0])
    with pytest.raises(ValueError, match="--inner_steps"):
        starling.Gossip(model, opt, gossip_swarm(), inner_steps=0)
    with pytest.raises(ValueError, match="unknown keyword 'momentum'"):
        starling.Gossip(model, opt, gossip_swarm(), momentum=0.5)
    with pytest.raises(ValueError, match="parameter weight is Double"):
        with starling.Gossip(torch.nn.Linear(4, 2).double(), opt,
                             gossip_swarm()):
            pass
    with pytest.raises(RuntimeError, match="Gossip.step.. outside its"):
        starling.Gossip(model, opt, gossip_swarm()).step()


def train_once(model, opt, x):
    loss = model(torch.full((3, 4), x)).pow(2).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_alone_a_gossip_period_applies_slowmo_and_writes_the_model():
    model, opt = small_linear()
    start = model.weight.detach().clone()
    weight = model.weight
    # Alone nothing is pushed or absorbed: with β = 0 and α = 2, SlowMo
    # makes y = x0 − 2(x0 − trained).
    with starling.Gossip(model, opt, gossip_swarm(), inner_steps=2,
                         gossip_momentum=0.0, gossip_outer_lr=2.0) as g:
        assert g.step(loss=train_once(model, opt, 1.0)) is None
        train_once(model, opt, 1.0)
        trained = model.weight.detach().clone()
        r = g.step()
        assert r["period"] == 1 and r["peer"] == "" and r["absorbed"] == 0
        assert r["weight"] == 1.0 and r["members"] == 1
        assert r["model_hash"] == g.model_hash
    assert model.weight is weight  # written in place
    assert torch.allclose(model.weight.detach(), 2 * trained - start,
                          rtol=0, atol=1e-6)
    assert not torch.equal(trained, start)


def test_a_gossip_push_carries_half_the_mass_and_the_receiver_averages_it():
    # Two members in one process, one step per period: a pushes (y_a, 1/2)
    # to b, b absorbs it at its next period (push-sum's weighted average,
    # weight 3/2) and pushes half of that back.
    port_a = free_ports(1)[0]
    model_a, opt_a = small_linear()
    model_b, opt_b = small_linear()
    ga = starling.Gossip(model_a, opt_a, starling.Swarm(
        node_id="a", listen="127.0.0.1:%d" % port_a, insecure=True,
        run_id="gossip"), inner_steps=1)
    gb = starling.Gossip(model_b, opt_b, starling.Swarm(
        node_id="b", listen="127.0.0.1:%d" % free_ports(1)[0], insecure=True,
        run_id="gossip", peers="127.0.0.1:%d" % port_a, min_members=2),
        inner_steps=1)
    import threading
    t = threading.Thread(target=ga.start)
    t.start()
    try:
        gb.start()
        t.join()
        train_once(model_a, opt_a, 1.0)
        y_a = model_a.weight.detach().clone()
        ra = ga.step()
        assert ra["peer"] == "b" and ra["weight"] == 0.5 and ra["absorbed"] == 0
        train_once(model_b, opt_b, -2.0)
        y_b = model_b.weight.detach().clone()
        rb = gb.step()
        assert rb["absorbed"] == 1 and rb["peer"] == "a"
        assert rb["weight"] == 0.75  # (1 + 1/2) / 2
        assert torch.allclose(model_b.weight.detach(),
                              (1.0 * y_b + 0.5 * y_a) / 1.5, rtol=0,
                              atol=1e-6)
        ra = ga.step()  # a absorbs b's push without training, pushes again
        assert ra["absorbed"] == 1 and ga.weight == (0.5 + 0.75) / 2
        assert ga.counters["pushes"] == 2 and gb.counters["absorbs"] == 1
    finally:
        ga.close()
        gb.close()
        t.join()


# Gossip checkpoints: the same keywords as DiLoCo's, plus the push-sum
# weight and the SlowMo momentum.

def adamw_linear(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def params_of(model):
    return [p.detach().clone() for p in model.parameters()]


def test_a_resumed_gossip_member_goes_on_from_its_weight_model_and_slowmo(
        tmp_path):
    run = tmp_path / "a"
    port_a = free_ports(1)[0]
    model_a, opt_a = adamw_linear(0)
    model_b, opt_b = adamw_linear(0)
    init = params_of(model_a)
    slowmo = dict(inner_steps=1, gossip_momentum=0.5)
    ga = starling.Gossip(model_a, opt_a, starling.Swarm(
        node_id="a", listen="127.0.0.1:%d" % port_a, insecure=True,
        run_id="gossip"), out=str(run), **slowmo)
    gb = starling.Gossip(model_b, opt_b, starling.Swarm(
        node_id="b", listen="127.0.0.1:%d" % free_ports(1)[0], insecure=True,
        run_id="gossip", peers="127.0.0.1:%d" % port_a, min_members=2),
        **slowmo)
    import threading
    t = threading.Thread(target=ga.start)
    t.start()
    try:
        gb.start()
        t.join()
        assert not ga.resumed
        train_once(model_a, opt_a, 1.0)
        t1 = params_of(model_a)
        r = ga.step()
        # a pushed half its mass to b; alone in its period, SlowMo's first
        # step (u = x0 - t1, y = x0 - u) leaves y = t1.
        assert r["peer"] == "b" and r["weight"] == 0.5 and r["period"] == 1
        saved, saved_hash = params_of(model_a), ga.model_hash
        saved_opt = opt_a.state_dict()["state"][0]["exp_avg"].clone()
    finally:
        ga.close()  # checkpoints into `run`, then leaves
        gb.close()
        t.join()
    assert all(torch.equal(p, q) for p, q in zip(saved, t1))
    # Another seed's model and a fresh optimizer take all of it back.
    model, opt = adamw_linear(5)
    with starling.Gossip(model, opt, gossip_swarm(), out=str(run),
                         resume=True, **slowmo) as g:
        assert g.resumed and g.weight == 0.5
        # (_d.step: the inner steps the driver counted, which
        # checkpoint_every's boundaries are of.)
        assert g.periods == 1 and g._d.step == 1
        assert g.model_hash == saved_hash
        assert all(torch.equal(p, q) for p, q in zip(params_of(model), saved))
        assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], saved_opt)
        train_once(model, opt, -1.0)
        t2 = params_of(model)
        r = g.step()
        assert r["period"] == 2 and r["weight"] == 0.5 and g._d.step == 2
    # SlowMo went on from the saved u = x0 - t1: u' = u/2 + (t1 - t2) and
    # y = t1 - u' = t2 - (x0 - t1)/2 (a lost u would leave y = t2).
    for p, x0, a, b in zip(model.parameters(), init, t1, t2):
        assert torch.allclose(p.detach(), b - 0.5 * (x0 - a), rtol=0,
                              atol=1e-6)
        assert not torch.allclose(p.detach(), b, rtol=0, atol=1e-4)


GOSSIP_MEMBER = textwrap.dedent("""
    import json, sys, time, torch, starling
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    swarm = starling.Swarm(node_id="k", listen=sys.argv[1], insecure=True)
    with starling.Gossip(model, opt, swarm, inner_steps=1,
                         gossip_momentum=0.5, out=sys.argv[2],
                         checkpoint_every=2, resume_if_exists=True) as g:
        print(json.dumps({"resumed": g.resumed, "period": g.periods,
                          "weight": g.weight, "params": [
                              p.detach().reshape(-1).tolist()
                              for p in model.parameters()]}), flush=True)
        while True:
            x = torch.randn(3, 4)
            loss = model(x).pow(2).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            r = g.step()
            r["params"] = [p.detach().reshape(-1).tolist()
                           for p in model.parameters()]
            print(json.dumps(r), flush=True)
            if r["period"] == 3:
                time.sleep(600)  # killed here, after period 3
""")


def test_kill_9_of_a_gossip_member_then_resume_from_its_checkpoint(tmp_path):
    run = str(tmp_path / "k")
    listen = "127.0.0.1:%d" % free_ports(1)[0]

    def start():
        return subprocess.Popen([sys.executable, "-c", GOSSIP_MEMBER,
                                 listen, run], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    p = start()
    lines = []
    for line in p.stdout:
        lines.append(json.loads(line))
        if lines[-1].get("period") == 3:
            break
    p.kill()  # after period 3, whose step (3) wrote no checkpoint
    p.communicate()
    assert not lines[0]["resumed"] and lines[0]["period"] == 0
    [period2] = [l for l in lines if l.get("period") == 2 and "peer" in l]
    p = start()
    first = json.loads(p.stdout.readline())
    p.kill()
    _, stderr = p.communicate()
    assert first["resumed"], stderr
    assert first["period"] == 2 and first["weight"] == 1.0
    # Exactly the parameters period 2 wrote (fp32 through JSON's doubles).
    assert first["params"] == period2["params"]
    assert first["params"] != lines[-1]["params"]


def test_gossip_checkpoint_errors_are_clear_and_come_first(tmp_path):
    def start(model=None, member=starling.Gossip, **flags):
        model = model or torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with member(model, opt, gossip_swarm(), **flags):
            pass

    with pytest.raises(ValueError, match="--resume needs --out=DIR"):
        start(resume=True)
    with pytest.raises(ValueError, match="--resume: no checkpoint at .*empty"):
        start(resume=True, out=str(tmp_path / "empty"))
    gossip_run = str(tmp_path / "g")
    start(out=gossip_run)  # close() checkpoints
    with pytest.raises(ValueError, match="already holds a run .*pass --resume"):
        start(out=gossip_run)
    with pytest.raises(starling.SwarmError,
                       match="holds model python.*weight is float32\\[2,4\\] "
                             "at the checkpoint, float32\\[3,4\\]"):
        start(model=torch.nn.Linear(4, 3), out=gossip_run, resume=True)
    with pytest.raises(starling.SwarmError,
                       match="holds no SlowMo momentum.*--gossip_momentum"):
        start(out=gossip_run, resume=True, gossip_momentum=0.5)
    # Each kind resumes only its own checkpoints.
    with pytest.raises(starling.SwarmError,
                       match="is a starling.Gossip member's: resume it with "
                             "starling.Gossip"):
        start(member=starling.DiLoCo, out=gossip_run, resume=True)
    model, opt = linear(0)
    train_alone(tmp_path / "d", 1, model, opt)
    with pytest.raises(starling.SwarmError,
                       match="is a starling.DiLoCo member's: resume it with "
                             "starling.DiLoCo"):
        start(out=str(tmp_path / "d"), resume=True)
    with pytest.raises(ValueError, match="--snapshot_every: not available"):
        start(snapshot_every=1)
    if BINARY:  # `starling export` cannot rebuild a Python program's model
        p = subprocess.run([BINARY, "export", "--from=%s" % gossip_run,
                            "--out=%s" % (tmp_path / "x.pt")],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "written by the Python module (starling.DiLoCo or " \
            "starling.Gossip)" in p.stderr


def gossip_lines(lines):
    periods = [l for l in lines if "period" in l]
    [done] = [l for l in lines if l.get("done")]
    return periods, done


def mean(xs):
    return sum(xs) / len(xs)


def test_two_python_gossip_members_exchange_pushes_and_learn():
    procs = start_members(2, rounds=16,
                          extra=["--algo=gossip", "--compression=int8",
                                 "--step_sleep=0.02"])
    res = results(procs)
    for rc, lines, stderr in res:
        assert rc == 0, stderr
        periods, done = gossip_lines(lines)
        assert len(periods) == 16, lines
        assert done["counters"]["pushes"] >= 8, done
        assert done["counters"]["absorbs"] >= 8, done
        assert mean([p["loss"] for p in periods[-3:]]) < \
            0.8 * periods[0]["loss"], periods
    # They gossip: their models are near each other (each trained on its
    # own data from the same start).
    pa, pb = (gossip_lines(lines)[1]["params"] for _, lines, _ in res)
    far = max(abs(x) for x in pa)
    assert max(abs(x - y) for x, y in zip(pa, pb)) < 0.25 * far, (pa, pb)


def test_kill_9_of_a_python_gossip_member_the_survivors_finish():
    procs = start_members(3, rounds=30,
                          extra=["--algo=gossip", "--step_sleep=0.02"])
    victim = procs[2]
    for line in victim.stdout:  # its first period pushed: now mid-run
        if '"period"' in line:
            break
    victim.kill()
    victim.communicate()
    for rc, lines, stderr in results(procs[:2], timeout=300):
        assert rc == 0, stderr
        periods, done = gossip_lines(lines)
        assert len(periods) == 30, lines
        # The survivors still push to each other after the kill.
        assert any(p["peer"] in ("p0", "p1") for p in periods[-5:]), periods
        assert sum(p["absorbed"] for p in periods[-10:]) > 0, periods


def test_python_and_cxx_gossip_members_exchange_pushes_and_learn(tmp_path):
    model = os.path.join(FIXTURES, "byte_bn.pt")
    if not BINARY or not os.path.exists(model):
        pytest.skip("needs STARLING_BINARY and STARLING_FIXTURES/byte_bn.pt")
    text = os.path.join(HERE, "..", "..", "docs", "design.md")
    ports = free_ports(3)
    seed = "127.0.0.1:%d" % ports[0]
    cxx = []
    for i in range(2):
        args = [BINARY, "node", "--insecure", "--run_id=pytest",
                "--algo=gossip", "--node_id=c%d" % i,
                "--listen=127.0.0.1:%d" % ports[i],
                "--model=torchscript:%s" % model, "--data=text:%s" % text,
                "--context=16", "--batch=32", "--steps=100", "--lr=1e-2",
                "--inner_steps=5", "--min_members=3", "--seed=%d" % i,
                "--compression=int8", "--linger_seconds=0",
                "--out=%s" % (tmp_path / ("c%d" % i))]
        if i:
            args.append("--peers=" + seed)
        cxx.append(subprocess.Popen(args, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True))
    py = subprocess.Popen(
        [sys.executable, MEMBER, "--node_id=p0", "--algo=gossip",
         "--listen=127.0.0.1:%d" % ports[2], "--peers=" + seed,
         "--rounds=20", "--inner_steps=5", "--min_members=3",
         "--compression=int8", "--torchscript=%s" % model,
         "--text=%s" % text],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    [(rc, lines, stderr)] = results([py])
    cxx_err = []
    for p in cxx:
        if rc != 0:
            p.kill()
        cxx_err.append(p.communicate(timeout=240)[1])
    assert rc == 0, stderr + "\n".join(cxx_err)
    periods, done = gossip_lines(lines)
    assert len(periods) == 20
    # The Python member took pushes from the C++ nodes and pushed to them.
    assert {p["peer"] for p in periods} & {"c0", "c1"}, periods
    assert done["counters"]["absorbs"] > 0, done
    assert mean([p["loss"] for p in periods[-3:]]) < \
        0.85 * periods[0]["loss"], periods
    absorbed_from_python = 0
    for i, p in enumerate(cxx):
        assert p.returncode == 0, cxx_err[i]
        events = [json.loads(l) for l in
                  (tmp_path / ("c%d" % i) / "events.jsonl").read_text()
                  .splitlines()]
        absorbed_from_python += sum(
            1 for e in events if e.get("event") == "exchange" and
            e.get("kind") == "absorb" and e.get("peer") == "p0")
        pushes = [e["train_loss"] for e in events
                  if e.get("event") == "exchange" and e.get("kind") == "push"]
        assert pushes and pushes[-1] < 0.85 * pushes[0], pushes
    assert absorbed_from_python > 0


def test_ctrl_c_of_a_gossip_member_says_goodbye_and_metrics_say_gossip():
    procs = start_members(2, rounds=400,
                          extra=["--algo=gossip", "--step_sleep=0.02"],
                          per_member=[["--metrics_port=0"], []])
    survivor, victim = procs
    try:
        first = json.loads(survivor.stdout.readline())
        for line in victim.stdout:  # a period done: now mid-run
            if '"period"' in line:
                break
        victim.send_signal(signal.SIGINT)
        out, err = victim.communicate(timeout=120)
        assert victim.returncode == 130, err
        assert '"interrupted": true' in out
        for line in survivor.stdout:  # a goodbye, not the failure detector
            peers = json.loads(line).get("peers", {})
            assert peers.get("p1") in ("alive", "left"), peers
            if peers.get("p1") == "left":
                break
        else:
            pytest.fail("p0 never saw p1 leave")
        text = scrape(first["metrics"])
        [info] = [l for l in text.splitlines()
                  if l.startswith("starling_build_info{")]
        assert 'algo="gossip"' in info and 'node="p0"' in info, info
        assert sample(text, "starling_inner_steps_total") >= 5
    finally:
        survivor.send_signal(signal.SIGINT)
        survivor.communicate(timeout=120)
