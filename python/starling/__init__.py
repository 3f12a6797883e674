"""Starling from a PyTorch training loop: DiLoCo rounds or push-sum gossip
over Starling's swarm.

    import starling, torch
    swarm = starling.Swarm(node_id="a", listen="127.0.0.1:7001",
                           peers=["127.0.0.1:7002"], run_id="demo",
                           insecure=True)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with starling.DiLoCo(model, opt, swarm, inner_steps=50,
                         compression="int8") as d:
        for x, y in loader:
            loss = loss_fn(model(x), y)
            opt.zero_grad(); loss.backward(); opt.step()
            d.step()   # every inner_steps-th call runs a round

Keyword arguments are `starling node`'s flags (`starling node --help`):
Swarm takes the swarm's (listen, peers, node_id, run_id, insecure, tls_cert,
tls_key, tls_ca, join_token_file, connect_timeout, min_members, ...),
DiLoCo the round's (inner_steps, compression, error_feedback, outer_lr,
outer_momentum, weighting, aggregate, norm_bound, ...). A list is joined
with commas, a bool is true/false. Bad values raise ValueError with the
message the CLI prints.

A round runs in C++ with the GIL released (node/embedded_diloco.h): the
pseudo-gradient against θ_global, compression with error feedback, the
exchange through the swarm's round protocol and ring all-reduce, the outer
Nesterov step, and θ and the averaged buffers written back into the
model's own tensors. Members whose rounds commit hold identical models, so
Python members and `starling node` members with the same fingerprint share
a run. Leaving the `with` block (also on Ctrl-C or SIGTERM, after the round
in flight) says goodbye to the swarm.

starling.Gossip(model, opt, swarm, inner_steps=H, compression=...,
gossip_peers=..., gossip_momentum=..., gossip_outer_lr=...) is used the same
way and runs `starling node --algo=gossip`'s push-sum period every H steps
(node/embedded_gossip.h): absorb the pushes received, optional SlowMo
momentum, push (y, w/2) to one live peer, parameters written back.

Checkpoints are the node's: with out=DIR, OUT/checkpoint.ckpt is written
every checkpoint_every inner steps (after the round that crosses the
boundary) and on leaving, holding θ_global, the outer optimizer's state, the
error-feedback residual, the round and the inner optimizer's state_dict. A
DiLoCo with resume=True (or resume_if_exists=True) and the same out starts
from it: the model's tensors and the inner optimizer are loaded, the round
goes on from the saved one (then catches up if the swarm is ahead). A
Gossip's checkpoint holds the model after the last period, the push-sum
weight and the SlowMo momentum instead, and a resumed Gossip goes on from
them. The data loader's position and learning-rate schedulers are the
caller's to save. metrics_port= and health_port= serve the node's
Prometheus metrics and gRPC health checks. See docs/python.md.
"""

try:
    import torch
except ImportError as e:  # pragma: no cover - depends on the interpreter
    raise ImportError(
        "starling needs PyTorch: `import torch` failed (%s). Use the Python "
        "it was built for (Debian's /usr/bin/python3 with python3-torch), or "
        "a virtual environment made with --system-site-packages" % e) from e

try:
    from . import _build_info
except ImportError as e:
    raise ImportError(
        "this is the source tree's starling package (%s), which has no "
        "compiled module: import the built one from the build tree, "
        "PYTHONPATH=build/python" % __file__) from e

if torch.__version__ != _build_info.TORCH_VERSION:
    raise ImportError(
        "starling was built against torch %s (for %s), but this Python "
        "imports torch %s from %s: use that Python, or rebuild Starling "
        "(./scripts/build.sh) against this torch"
        % (_build_info.TORCH_VERSION, _build_info.PYTHON, torch.__version__,
           torch.__file__))

import io as _io
import math as _math
import signal as _signal
import threading as _threading
import time as _time

from ._starling import SwarmError, _Diloco, _Gossip, _architecture
from ._starling import _check_flags, _model_hash, _node_flag_names
from ._starling import torchscript_architecture

__all__ = ["Swarm", "DiLoCo", "Gossip", "SwarmError", "architecture_of",
           "model_hash", "torchscript_architecture"]

_NODE_FLAGS = frozenset(_node_flag_names())


def _flag_args(flags, who):
    args = []
    for name, value in flags.items():
        if value is None:
            continue
        if name not in _NODE_FLAGS:
            raise ValueError(
                "%s: unknown keyword %r (the keywords are `starling node`'s "
                "flags: starling node --help)" % (who, name))
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        args.append("--%s=%s" % (name, value))
    return args


class Swarm:
    """Where a member joins: the node's swarm flags, checked at once.

    The swarm starts when a DiLoCo built on it enters its `with` block,
    since the handshake carries the model's fingerprint.
    """

    def __init__(self, node_id=None, listen=None, peers=None, run_id=None,
                 **flags):
        self.flags = dict(node_id=node_id, listen=listen, peers=peers,
                          run_id=run_id, **flags)
        _check_flags(_flag_args(self.flags, "starling.Swarm"))


def _model_tensors(model):
    params = [(n, p) for n, p in model.named_parameters()]
    buffers = [(n, b) for n, b in model.named_buffers()]
    return ([n for n, _ in params], [p.data for _, p in params],
            [n for n, _ in buffers], [b.data for _, b in buffers])


def architecture_of(model):
    """The handshake's name for an eager model: python(DIGEST), a digest of
    its parameters' and buffers' names, shapes and dtypes."""
    return _architecture(*_model_tensors(model))


def model_hash(model):
    """The hash of the model's parameters and buffers as `starling node`
    computes its model_hash (16 hex digits)."""
    _, params, _, buffers = _model_tensors(model)
    return _model_hash(params, buffers)


class _Member:
    """What DiLoCo and Gossip share: the flags, the `with` block, SIGTERM,
    the inner steps' metrics and the swarm's view."""

    _who = "starling.Member"

    def __init__(self, model, inner_optimizer, swarm, inner_steps, flags,
                 architecture):
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.swarm = swarm
        self.inner_steps = int(inner_steps)
        merged = dict(swarm.flags)
        merged.update(dict(inner_steps=self.inner_steps, **flags))
        self._args = _flag_args(merged, self._who)
        _check_flags(self._args)
        if architecture is None:
            architecture = getattr(model, "starling_architecture", "")
        self._architecture = architecture
        self._d = None
        self._closed = False
        self._steps = 0
        self._samples = 0
        self._old_sigterm = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _started(self, driver):
        self._d = driver
        state = driver.resumed_user_state
        if state:
            self.inner_optimizer.load_state_dict(
                torch.load(_io.BytesIO(state)))
        if (_threading.current_thread() is _threading.main_thread() and
                _signal.getsignal(_signal.SIGTERM) == _signal.SIG_DFL):
            # SIGTERM leaves like Ctrl-C: the `with` block exits, saying
            # goodbye, once the exchange in flight is done.
            def _on_term(signum, frame):
                raise KeyboardInterrupt("SIGTERM")
            self._old_sigterm = _signal.signal(_signal.SIGTERM, _on_term)
        self._mark = _time.perf_counter()

    def _count_step(self, samples, loss, tokens):
        """Feeds the watchdog and the metrics; True at the H-th step."""
        if self._d is None:
            raise RuntimeError("%s.step() outside its `with` block "
                               "(or before start())"
                               % type(self).__name__)
        n = 1 if samples is None else int(samples)
        lr = self.inner_optimizer.param_groups[0].get("lr", 0.0)
        self._d.inner_step(_time.perf_counter() - self._mark,
                           n if tokens is None else int(tokens),
                           _math.nan if loss is None else float(loss),
                           float(lr))
        self._steps += 1
        self._samples += n
        if self._steps < self.inner_steps:
            self._mark = _time.perf_counter()
            return False
        return True

    def checkpoint(self):
        """Writes OUT/checkpoint.ckpt now (DiLoCo: the last committed round;
        Gossip: the model after the last period, its push-sum weight and
        SlowMo momentum) with the inner optimizer's state_dict; needs out=.
        step() and close() call it as --checkpoint_every says."""
        blob = _io.BytesIO()
        torch.save(self.inner_optimizer.state_dict(), blob)
        self._d.checkpoint(blob.getvalue())

    def close(self):
        """Checkpoints (with out=), then says goodbye to the swarm.
        Idempotent."""
        try:
            if (self._d is not None and self._d.checkpoints and
                    not self._closed):
                self.checkpoint()
        finally:
            self._closed = True
            self._leave()

    def _leave(self):
        if self._d is not None:
            self._d.leave()
        if self._old_sigterm is not None:
            _signal.signal(_signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None

    def members(self):
        """The swarm's members as this one sees them: dicts of id, address,
        state (alive, suspect, dead, left) and round."""
        return self._d.members()

    @property
    def resumed(self):
        """Whether this member started from the checkpoint in out=."""
        return self._d.resumed

    @property
    def address(self):
        return self._d.address

    @property
    def health_address(self):
        """host:port of the gRPC health service (health_port=), or ""."""
        return self._d.health_address

    @property
    def metrics_address(self):
        """host:port serving /metrics (metrics_port=), or ""."""
        return self._d.metrics_address

    @property
    def architecture(self):
        return self._d.architecture


class DiLoCo(_Member):
    """DiLoCo over `swarm` for `model`, whose inner steps `inner_optimizer`
    takes in the caller's loop. Call step() after each inner_optimizer.step().

    architecture: the model's name in the handshake; by default the model's
    `starling_architecture` attribute (python/starling_models.py's twins of
    the built-in models set it, so they can join `starling node` members),
    else architecture_of(model).
    """

    _who = "starling.DiLoCo"

    def __init__(self, model, inner_optimizer, swarm, inner_steps=50,
                 compression=None, outer_lr=None, outer_momentum=None,
                 overlap=False, architecture=None, **flags):
        super().__init__(model, inner_optimizer, swarm, inner_steps,
                         dict(compression=compression, outer_lr=outer_lr,
                              outer_momentum=outer_momentum,
                              overlap=overlap or None, **flags),
                         architecture)
        self.last_round = None

    def start(self):
        """Starts the swarm, joins it and waits for --min_members."""
        if self._d is not None:
            return
        self._started(_Diloco(self._args, *_model_tensors(self.model),
                              self._architecture))

    def step(self, samples=None, loss=None, tokens=None):
        """Counts one inner step (of `samples` examples, for the weighting);
        at the inner_steps-th, runs the round and returns what it did (a
        dict: outcome, round, members, model_hash, seconds, wire_bytes).
        `loss` and `tokens` (default: samples) only feed the metrics
        (starling_train_loss, starling_tokens_total); the step's time is
        the time since the previous step() returned."""
        if not self._count_step(samples, loss, tokens):
            return None
        steps, samples_done = self._steps, self._samples
        self._steps = self._samples = 0
        with torch.no_grad():
            self.last_round = self._d.round(steps, samples_done)
        if self.last_round.pop("checkpoint_due"):
            self.checkpoint()
        self._mark = _time.perf_counter()
        return self.last_round

    @property
    def round(self):
        return self._d.round_number

    @property
    def model_hash(self):
        """The hash of θ_global and the buffers, as `starling node` logs
        it: equal on every member after a committed round."""
        return self._d.model_hash



class Gossip(_Member):
    """Asynchronous push-sum gossip (`starling node --algo=gossip`) over
    `swarm` for `model`, whose inner steps `inner_optimizer` takes in the
    caller's loop. Call step() after each inner_optimizer.step().

    Every inner_steps-th step runs one gossip period in C++ with the GIL
    released (node/embedded_gossip.h, the node's own period): the pushes
    received since the last one are averaged in, the optional SlowMo
    momentum applied (gossip_momentum, gossip_outer_lr), and (y, w/2) is
    pushed to one live peer (gossip_peers: random or exponential; lossy
    compression pushes the difference to the copy that peer holds). The
    result is written back into the model's parameters; buffers stay this
    member's own, as in the node. No barrier: a slow or dead peer never
    blocks a period. Python members and `starling node --algo=gossip`
    members with the same fingerprint gossip in one swarm.

    architecture: as for DiLoCo. out=, checkpoint_every=, resume=,
    resume_if_exists=: as for DiLoCo; the checkpoint holds the model after
    the last period, the push-sum weight, the SlowMo momentum, the period
    and step counts and the inner optimizer's state_dict, and a resumed
    member goes on from all of them.
    """

    _who = "starling.Gossip"

    def __init__(self, model, inner_optimizer, swarm, inner_steps=50,
                 compression=None, gossip_peers=None, gossip_momentum=None,
                 gossip_outer_lr=None, architecture=None, **flags):
        super().__init__(model, inner_optimizer, swarm, inner_steps,
                         dict(algo="gossip", compression=compression,
                              gossip_peers=gossip_peers,
                              gossip_momentum=gossip_momentum,
                              gossip_outer_lr=gossip_outer_lr, **flags),
                         architecture)
        self._loss_sum = 0.0
        self._losses = 0
        self.last_period = None

    def start(self):
        """Starts the swarm, joins it and waits for --min_members."""
        if self._d is None:
            self._started(_Gossip(self._args, *_model_tensors(self.model),
                                  self._architecture))

    def step(self, samples=None, loss=None, tokens=None):
        """Counts one inner step; at the inner_steps-th, runs the gossip
        period and returns what it did (a dict: period, peer (whom it
        pushed to, "" if none), absorbed (pushes averaged in), weight (the
        push-sum weight), members (live, this one included), model_hash,
        seconds, wire_bytes). `samples`, `loss` and `tokens` feed the
        metrics; the mean `loss` of the period goes with the push."""
        if loss is not None:
            self._loss_sum += float(loss)
            self._losses += 1
        if not self._count_step(samples, loss, tokens):
            return None
        steps = self._steps
        mean = self._loss_sum / self._losses if self._losses else _math.nan
        self._steps = self._samples = self._losses = 0
        self._loss_sum = 0.0
        with torch.no_grad():
            self.last_period = self._d.period(steps, mean)
        if self.last_period.pop("checkpoint_due"):
            self.checkpoint()
        self._mark = _time.perf_counter()
        return self.last_period

    @property
    def periods(self):
        """The gossip periods done."""
        return self._d.periods

    @property
    def weight(self):
        """The push-sum weight: Σ over the swarm stays its member count."""
        return self._d.weight

    @property
    def counters(self):
        """exchanges, pushes, absorbs, failed_pushes, raw_bytes,
        wire_bytes, max_world: the node's summary fields."""
        return self._d.counters

    @property
    def model_hash(self):
        """The hash of the parameters (16 hex digits)."""
        return self._d.model_hash
