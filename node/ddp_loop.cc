#include "node/ddp_loop.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "node/peer_address.h"

namespace starling {
namespace {

constexpr char kGrad[] = "grad";

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

std::vector<std::string> RankIds(int world) {
  std::vector<std::string> ids;
  for (int r = 0; r < world; ++r) ids.push_back(absl::StrCat("n", r));
  return ids;
}

}  // namespace

absl::StatusOr<StaticMembers> ParseMembers(const std::string& listen,
                                           const std::string& peers) {
  StaticMembers m;
  if (!ValidHostPort(listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": expected host:port"));
  }
  m.members.push_back(listen);
  for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty())) {
    if (!ValidHostPort(p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peers: '", p, "' is not host:port"));
    }
    m.members.emplace_back(p);
  }
  std::sort(m.members.begin(), m.members.end());
  if (std::adjacent_find(m.members.begin(), m.members.end()) !=
      m.members.end()) {
    return absl::InvalidArgumentError(
        "--peers lists an address twice (or this node's own --listen)");
  }
  if (m.members.size() > 1 && absl::EndsWith(listen, ":0")) {
    return absl::InvalidArgumentError(
        "--listen needs a fixed port when --peers is set (peers must know it)");
  }
  m.rank =
      static_cast<int>(std::find(m.members.begin(), m.members.end(), listen) -
                       m.members.begin());
  return m;
}

int RunDdp(NodeRun& run) {
  absl::StatusOr<StaticMembers> members =
      ParseMembers(run.config.net.listen, run.config.net.peers);
  if (!members.ok()) return Fail(members.status(), 2);
  return DdpLoop(run, *std::move(members)).Run();
}

DdpLoop::DdpLoop(NodeRun& run, StaticMembers members)
    : run_(run),
      trainer_(run.trainer),
      config_(run.config),
      members_(std::move(members)),
      world_(static_cast<int>(members_.members.size())),
      total_(run.config.train.steps()),
      ids_(RankIds(world_)),
      session_(run, ids_[members_.rank]) {}

int DdpLoop::Run() {
  if (absl::Status s = Start(); !s.ok()) return Fail(s);
  absl::StatusOr<bool> interrupted = Train();
  if (!interrupted.ok()) return Fail(interrupted.status());
  return End(*interrupted);
}

absl::Status DdpLoop::Start() {
  const NetworkConfig& net = config_.net;
  const int rank = members_.rank;
  session_.LogModel(absl::StrCat(session_.node_id(), " of ", world_, " (ddp)"));
  if (world_ > 1) {
    GrpcTransportOptions to;
    to.listen = members_.members[rank];
    to.chunk_bytes = net.chunk_bytes;
    to.rpc_timeout = net.round_timeout;
    to.links = net.links;
    to.credentials = net.credentials;
    to.stream_idle_timeout = net.stream_idle_timeout;
    to.peer_max_streams = net.peer_max_streams;
    to.chunk_stream_deadline = to.rpc_timeout + absl::Minutes(1);
    PeerIdentity id;
    id.run_id = net.run_id;
    id.algo = "ddp";
    id.world = world_;
    id.compression = "fp32";
    id.model =
        MakeFingerprint(trainer_.model().Architecture(), run_.n_params,
                        run_.init_hash, TensorSignature(trainer_.model()));
    STARLING_ASSIGN_OR_RETURN(transport_, GrpcTransport::Start(to, id));
    MailboxOptions mo;
    mo.run_id = id.run_id;
    mo.tensors = {{kGrad, run_.n_params + 2 + NumElements(run_.buffers)}};
    mo.first_round = run_.state.round;
    STARLING_LOG(INFO) << "listening on " << transport_->address()
                       << "; connecting to " << world_ - 1 << " peers";
    absl::Status s = transport_->Connect(members_.members, rank, mo,
                                         absl::Now() + net.connect_timeout);
    if (!s.ok()) return WithExitCode(s, absl::IsFailedPrecondition(s) ? 2 : 1);
    transport_->mailbox().AdvanceRound(run_.state.round);
    GrpcTransport* t = transport_.get();
    session_.SetTraffic([t] { return t->bytes_sent(); },
                        [t] { return t->bytes_received(); });
  }
  session_.Start(JsonObject()
                     .Add("rank", static_cast<int64_t>(rank))
                     .Add("world", static_cast<int64_t>(world_))
                     .Add("algo", "ddp")
                     .Add("round", run_.state.round)
                     .Add("step", static_cast<int64_t>(trainer_.state().step()))
                     .Add("parameters", run_.n_params)
                     .Add("model_hash", run_.init_hash));
  session_.StartMetricsPoller();
  return absl::OkStatus();
}

absl::StatusOr<bool> DdpLoop::Train() {
  buffers_synced_ = Flatten(run_.buffers);
  while (trainer_.state().step() < total_) {
    if (!transport_ && StopSignal() != 0) return true;
    STARLING_ASSIGN_OR_RETURN(const bool go_on, RunStep());
    if (!go_on) return true;
  }
  return false;
}

absl::Status DdpLoop::AverageGradients(
    const std::vector<torch::Tensor>& params) {
  std::vector<float> g = FlattenGrads(params);
  const size_t n = g.size();
  // What this step's forward passes moved the buffers by: averaged with
  // the gradients (a buffer no member moved stays exact).
  const std::vector<float> moved =
      BufferDelta(buffers_synced_, Flatten(run_.buffers));
  g.insert(g.end(), moved.begin(), moved.end());
  RingOptions o;
  o.step_timeout = config_.net.round_timeout;
  o.tensor = kGrad;
  o.round = run_.state.round;
  std::vector<float> votes = {StopSignal() != 0 ? 1.0f : 0.0f};
  o.extra_sums = &votes;
  STARLING_RETURN_IF_ERROR(RingWeightedAverage(
      *transport_, g, static_cast<double>(config_.train.batch()), o));
  stop_voted_ = stop_voted_ || votes[0] > 0;
  ApplyBufferMean(absl::MakeConstSpan(g).subspan(n), 1.0,
                  absl::MakeSpan(buffers_synced_));
  STARLING_RETURN_IF_ERROR(Unflatten(buffers_synced_, run_.buffers));
  g.resize(n);
  return UnflattenGrads(g, params);
}

absl::StatusOr<bool> DdpLoop::RunStep() {
  NodeState& state = run_.state;
  const absl::Time round_start = absl::Now();
  const int64_t sent_before = session_.BytesSent();
  const int prev_step = trainer_.state().step();
  if (transport_) transport_->mailbox().AdvanceRound(state.round);
  Trainer::GradientHook hook = nullptr;
  if (world_ > 1) {
    hook = [this](const std::vector<torch::Tensor>& params) {
      return AverageGradients(params);
    };
  }
  run_.ops.SetReady(StopSignal() == 0);
  // A step waits for the all-reduce: its timeout on top of the step.
  run_.ops.watchdog->Waiting(config_.net.round_timeout);
  STARLING_ASSIGN_OR_RETURN(
      const StepResult r,
      session_.Step(state.round + 1, /*log_data_drift=*/true, hook));
  if (run_.ops.metrics) run_.ops.metrics->Round(kRoundCommitted, r.seconds, 0);
  RoundRecord rec;
  rec.round = state.round;
  rec.step = trainer_.state().step();
  rec.members = ids_;
  rec.model_hash = ModelHash(run_.params, run_.buffers);
  rec.train_loss = r.loss;
  rec.bytes = session_.BytesSent() - sent_before;
  rec.seconds = absl::ToDoubleSeconds(absl::Now() - round_start);
  ++state.round;
  STARLING_RETURN_IF_ERROR(
      session_.RecordRound(rec, members_.rank == 0, prev_step));
  const int log_every = config_.train.log_every();
  if ((log_every > 0 && rec.step % log_every == 0) || rec.step == total_) {
    WriteStderrLine(absl::StrFormat(
        "%s step %d/%d | loss %.4f | sent %s | hash %s | eta %s",
        session_.node_id(), rec.step, total_, rec.train_loss,
        FormatBytes(static_cast<double>(session_.BytesSent())),
        rec.model_hash.substr(0, 8), session_.Eta(rec.step)));
  }
  if (session_.CheckpointDue(prev_step, rec.step)) {
    session_.PeriodicCheckpoint(state.round);
  }
  return !(stop_voted_ && rec.step < total_);
}

int DdpLoop::End(bool interrupted) {
  run_.ops.SetReady(false);
  SessionEnd end;
  end.stopped = interrupted;
  end.next_round = run_.state.round;
  end.world = world_;
  end.end_fields.Add("round", run_.state.round);
  end.summary.Add("algo", "ddp")
      .Add("rank", static_cast<int64_t>(members_.rank))
      .Add("world", static_cast<int64_t>(world_))
      .Add("inner_steps_per_round", int64_t{1});
  end.stopped_by = "interrupted by";
  end.shutdown = [this] {
    if (transport_) transport_->Shutdown();
  };
  return session_.Finish(std::move(end));
}

}  // namespace starling
