#include "node/ddp_loop.h"

#include "node/node_flags.h"

namespace starling {
namespace {

// Gradients of `params` as one flat fp32 vector (missing grads are zeros).
std::vector<float> FlattenGrads(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    grads.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  }
  return Flatten(grads);
}

absl::Status UnflattenGrads(const std::vector<float>& flat,
                            const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params) {
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad());
  }
  return Unflatten(flat, grads);
}

}  // namespace

// Synchronous data-parallel baseline over a fixed member list: gradients are
// all-reduced every step; members vote in every all-reduce so that a
// SIGINT/SIGTERM stops all of them after the same step.
int RunDdp(NodeRun& run) {
  Trainer& trainer = *run.trainer;
  const TrainConfig& config = run.config;
  absl::StatusOr<StaticMembers> membership =
      ParseMembers(absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_peers));
  if (!membership.ok()) return Fail(membership.status(), 2);
  const int world = static_cast<int>(membership->members.size());
  const int rank = membership->rank;
  const std::string node_id = absl::StrCat("n", rank);
  EventLog events(absl::StrCat(run.out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  STARLING_LOG(INFO) << node_id << " of " << world << " (ddp), "
                     << trainer.model().Architecture() << ", " << run.n_params
                     << " parameters, data " << trainer.dataset().Describe();
  std::unique_ptr<GrpcTransport> transport;
  if (world > 1) {
    GrpcTransportOptions to;
    to.listen = membership->members[rank];
    to.chunk_bytes = run.chunk;
    to.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
    to.links = run.links;
    to.credentials = run.credentials;
    to.stream_idle_timeout = run.stream_idle;
    to.peer_max_streams = run.peer_max_streams;
    to.chunk_stream_deadline = to.rpc_timeout + absl::Minutes(1);
    PeerIdentity id;
    id.run_id = absl::GetFlag(FLAGS_run_id);
    id.algo = "ddp";
    id.world = world;
    id.compression = "fp32";
    id.model = MakeFingerprint(trainer.model().Architecture(), run.n_params,
                               run.init_hash);
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t =
        GrpcTransport::Start(to, id);
    if (!t.ok()) return Fail(t.status(), 1);
    transport = std::move(t).value();
    MailboxOptions mo;
    mo.run_id = id.run_id;
    mo.tensors = {{kGrad, run.n_params + 2}};
    mo.first_round = run.round;
    STARLING_LOG(INFO) << "listening on " << transport->address()
                       << "; connecting to " << world - 1 << " peers";
    absl::Status s = transport->Connect(
        membership->members, rank, mo,
        absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_connect_timeout)));
    if (!s.ok()) return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
    transport->mailbox().AdvanceRound(run.round);
  }
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("rank", static_cast<int64_t>(rank))
                   .Add("world", static_cast<int64_t>(world))
                   .Add("algo", "ddp")
                   .Add("round", run.round)
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", run.n_params)
                   .Add("model_hash", run.init_hash));
  InstallStopSignals();
  auto bytes_sent = [&] {
    return run.prior[0] + (transport ? transport->bytes_sent() : 0);
  };
  auto bytes_received = [&] {
    return run.prior[1] + (transport ? transport->bytes_received() : 0);
  };
  std::vector<std::string> all_members;
  for (int r = 0; r < world; ++r) all_members.push_back(absl::StrCat("n", r));
  RingOptions ring;
  ring.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  bool interrupted = false, stop_voted = false;
  const int total = config.steps();
  while (trainer.state().step() < total) {
    if (!transport && StopSignal() != 0) {
      interrupted = true;
      break;
    }
    const auto round_start = absl::Now();
    const int64_t sent_before = bytes_sent();
    const int prev_step = trainer.state().step();
    if (transport) transport->mailbox().AdvanceRound(run.round);
    Trainer::GradientHook hook = nullptr;
    if (world > 1) {
      hook = [&](const std::vector<torch::Tensor>& ps) -> absl::Status {
        std::vector<float> g = FlattenGrads(ps);
        RingOptions o = ring;
        o.tensor = kGrad;
        o.round = run.round;
        std::vector<float> votes = {StopSignal() != 0 ? 1.0f : 0.0f};
        o.extra_sums = &votes;
        STARLING_RETURN_IF_ERROR(RingWeightedAverage(
            *transport, g, static_cast<double>(config.batch()), o));
        stop_voted = stop_voted || votes[0] > 0;
        return UnflattenGrads(g, ps);
      };
    }
    run.ops->SetReady(StopSignal() == 0);
    // A step waits for the all-reduce: its timeout on top of the step.
    run.ops->watchdog->Waiting(ring.step_timeout);
    absl::StatusOr<StepResult> r = trainer.Step(hook);
    if (!r.ok()) {
      events.Write("error", JsonObject().Add("message", r.status().message()));
      return Fail(r.status(), 1);
    }
    LogDrift(events, trainer, *r);
    SetLogPosition(run.round + 1, trainer.state().step());
    run.ops->Step(*r, trainer.state().step());
    if (run.ops->metrics) {
      run.ops->metrics->SetTraffic(bytes_sent(), bytes_received(), 0, 0);
      run.ops->metrics->Round(kRoundCommitted, r->seconds, 0);
    }
    RoundRecord rec;
    rec.round = run.round;
    rec.step = trainer.state().step();
    rec.members = all_members;
    rec.model_hash = ModelHash(run.params);
    rec.train_loss = r->loss;
    rec.bytes = bytes_sent() - sent_before;
    rec.seconds = absl::ToDoubleSeconds(absl::Now() - round_start);
    ++run.round;
    if (absl::Status s = run.RecordRound(rec, rank == 0, prev_step, events);
        !s.ok()) {
      return Fail(s, 1);
    }
    if ((config.log_every() > 0 && rec.step % config.log_every() == 0) ||
        rec.step == total) {
      double elapsed = events.WallSeconds();
      double eta = rec.step > 0 ? elapsed * (total - rec.step) / rec.step : 0;
      WriteStderrLine(absl::StrFormat(
          "%s step %d/%d | loss %.4f | sent %s | hash %s | eta %s", node_id,
          rec.step, total, rec.train_loss,
          FormatBytes(static_cast<double>(bytes_sent())),
          rec.model_hash.substr(0, 8), FormatDuration(eta)));
    }
    if (config.checkpoint_every() > 0 &&
        rec.step / config.checkpoint_every() >
            prev_step / config.checkpoint_every() &&
        rec.step < total) {
      if (absl::Status s = run.Checkpoint(
              run.round, bytes_sent(), bytes_received(), events.WallSeconds());
          !s.ok()) {
        return Fail(s, 1);
      }
    }
    if (stop_voted && rec.step < total) {
      interrupted = true;
      break;
    }
  }
  run.ops->SetReady(false);
  if (absl::Status s = run.Checkpoint(run.round, bytes_sent(), bytes_received(),
                                      events.WallSeconds());
      !s.ok()) {
    return Fail(s, 1);
  }
  NodeTotals totals = run.Totals(node_id, bytes_sent(), bytes_received(),
                                 events.WallSeconds(), world);
  if (absl::Status s = run.Finish(events, totals, rank, world, 1, interrupted);
      !s.ok()) {
    return Fail(s, 1);
  }
  if (transport) transport->Shutdown();
  if (interrupted) {
    WriteStderrLine(absl::StrCat(
        "starling node: interrupted by signal ", StopSignal(), " at step ",
        trainer.state().step(), "; checkpoint in ", run.ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat("%s done: %d steps, sent %s", node_id,
                                  trainer.state().step(),
                                  FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace starling
