#include "node/node_command.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "compression/codec.h"
#include "compression/tensor_policy.h"
#include "core/checkpoint.h"
#include "core/flat_params.h"
#include "core/logging.h"
#include "core/status.h"
#include "gossip/grpc_transport.h"
#include "gossip/ring_allreduce.h"
#include "node/run_output.h"
#include "node/train_command.h"
#include "outer_opt/outer_optimizer.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "host:port this node serves peers on; with --peers it must name a "
          "fixed port that the peers list too");
ABSL_FLAG(std::string, peers, "",
          "comma-separated host:port of every other member; empty = a single "
          "DiLoCo worker. Ranks follow the sorted list of all members");
ABSL_FLAG(std::string, run_id, "starling",
          "peers must share it; the handshake refuses others");
ABSL_FLAG(std::string, algo, "diloco",
          "diloco (H inner steps, then an outer step) | ddp (all-reduce of "
          "gradients every step, the synchronous data-parallel baseline)");
ABSL_FLAG(int, inner_steps, 50, "diloco: H, inner steps per round");
ABSL_FLAG(std::string, outer, "nesterov",
          "diloco outer optimizer: nesterov | average (lr 1, no momentum)");
ABSL_FLAG(double, outer_lr, 0.7, "diloco: outer learning rate");
ABSL_FLAG(double, outer_momentum, 0.9, "diloco: outer Nesterov momentum");
ABSL_FLAG(int, connect_timeout, 60,
          "seconds to keep retrying (with backoff) to reach every peer");
ABSL_FLAG(int, round_timeout, 300,
          "seconds one ring step of a round may wait for a peer");
ABSL_FLAG(int, chunk_bytes, 1 << 20,
          "tensor stream chunk size in bytes (1 MiB; at most 4 MiB)");
ABSL_FLAG(std::string, compression, "fp32",
          "diloco pseudo-gradient codec: fp32 | fp16 | bf16 | int8[:BLOCK] | "
          "int4[:BLOCK] | topk:FRACTION[+int8|+fp16], each optionally "
          "+zstd, e.g. int8, int8+zstd, topk:0.01+int8");
ABSL_FLAG(std::string, error_feedback, "auto",
          "auto (on for int4 and topk, off otherwise) | on | off: keep what "
          "the codec dropped and add it to the next round's pseudo-gradient");
ABSL_FLAG(int, small_tensor_elems, 4096,
          "with a lossy --compression, tensors with fewer elements (norms, "
          "biases) use --small_tensor_codec instead");
ABSL_FLAG(std::string, small_tensor_codec, "bf16",
          "codec for small tensors: bf16 | fp16 | fp32");

namespace starling {
namespace {

constexpr char kPseudoGrad[] = "pseudo_grad";
constexpr char kGrad[] = "grad";

int Fail(const absl::Status& s, int code) {
  WriteStderrLine(absl::StrCat("starling node: error: ", s.message()));
  return code;
}

struct Membership {
  std::vector<std::string> members;  // sorted; index = rank
  int rank = 0;
};

absl::StatusOr<Membership> ParseMembership(const std::string& listen,
                                           const std::string& peers) {
  Membership m;
  auto valid = [](absl::string_view a) {
    size_t colon = a.rfind(':');
    int port = 0;
    return colon != absl::string_view::npos && colon > 0 &&
           absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 0 &&
           port < 65536;
  };
  if (!valid(listen)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": expected host:port"));
  }
  m.members.push_back(listen);
  for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty())) {
    if (!valid(p)) {
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

const std::vector<std::string>& NodeFlagNames() {
  static const auto* names = new std::vector<std::string>{"listen",
                                                          "peers",
                                                          "run_id",
                                                          "algo",
                                                          "inner_steps",
                                                          "outer",
                                                          "outer_lr",
                                                          "outer_momentum",
                                                          "connect_timeout",
                                                          "round_timeout",
                                                          "chunk_bytes",
                                                          "compression",
                                                          "error_feedback",
                                                          "small_tensor_elems",
                                                          "small_tensor_codec"};
  return *names;
}

const Subcommand& NodeSubcommand() {
  static const Subcommand* sub = [] {
    std::vector<std::string> flags = NodeFlagNames();
    for (const std::string& f : TrainFlagNames()) flags.push_back(f);
    return new Subcommand{
        "node",
        "join a swarm (static member list) and train with DiLoCo or ddp",
        "Runs one member of a swarm. Every member is started with its own "
        "--listen address and the others' addresses in --peers, the same "
        "--run_id, --seed and model flags, and its own --shard=K/N. Members "
        "handshake (protocol version, run id, model fingerprint), then run "
        "--steps inner steps in rounds of --inner_steps (H); after each round "
        "a ring all-reduce averages the pseudo-gradients Δ = θ_global − "
        "θ_local "
        "(weighted by samples) and the outer optimizer steps θ_global, so "
        "every member holds bit-identical weights. --algo=ddp all-reduces "
        "gradients every step instead. Rank 0 evaluates.\n\n"
        "Example, two members on one machine:\n"
        "  starling node --listen=127.0.0.1:7001 --peers=127.0.0.1:7002 "
        "--shard=0/2 --out=runs/n0\n"
        "  starling node --listen=127.0.0.1:7002 --peers=127.0.0.1:7001 "
        "--shard=1/2 --out=runs/n1",
        flags};
  }();
  return *sub;
}

int RunNodeCommand() {
  TrainConfig config = ConfigFromFlags();
  if (absl::Status s = ResolveTrainConfig(&config); !s.ok()) return Fail(s, 2);
  const std::string algo = absl::GetFlag(FLAGS_algo);
  if (algo != "diloco" && algo != "ddp") {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--algo=", algo, ": expected diloco or ddp")),
                2);
  }
  const int h = absl::GetFlag(FLAGS_inner_steps);
  if (h < 1) {
    return Fail(absl::InvalidArgumentError(
                    absl::StrCat("--inner_steps=", h, ": must be >= 1")),
                2);
  }
  const int chunk = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk < 1024 || chunk > (4 << 20)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
                    "--chunk_bytes=", chunk, ": must be in [1024, 4194304]")),
                2);
  }
  absl::StatusOr<Membership> membership =
      ParseMembership(absl::GetFlag(FLAGS_listen), absl::GetFlag(FLAGS_peers));
  if (!membership.ok()) return Fail(membership.status(), 2);
  const int world = static_cast<int>(membership->members.size());
  const int rank = membership->rank;
  absl::StatusOr<std::unique_ptr<Trainer>> created = StartRun(&config, "node");
  if (!created.ok()) {
    return Fail(created.status(), ExitCodeFor(created.status()));
  }
  const std::string out = config.out();
  const std::string ckpt_path = CheckpointPathInRunDir(out);
  Trainer& trainer = **created;
  std::vector<torch::Tensor> params = trainer.Parameters();
  const int64_t n_params = NumElements(params);

  OuterOptions oo;
  oo.kind = absl::GetFlag(FLAGS_outer);
  oo.lr = absl::GetFlag(FLAGS_outer_lr);
  oo.momentum = absl::GetFlag(FLAGS_outer_momentum);
  absl::StatusOr<std::unique_ptr<OuterOptimizer>> outer =
      OuterOptimizer::Create(oo, n_params);
  if (!outer.ok()) return Fail(outer.status(), 2);

  // Pseudo-gradient compression: a per-tensor policy over the flat view
  // (params) and the same plus the fp32 averaging weight (the ring's tensor).
  const std::string compression = absl::GetFlag(FLAGS_compression);
  std::vector<int64_t> tensor_sizes;
  for (const auto& p : params) tensor_sizes.push_back(p.numel());
  PolicyOptions po;
  po.main = compression;
  po.small = absl::GetFlag(FLAGS_small_tensor_codec);
  po.small_elements = absl::GetFlag(FLAGS_small_tensor_elems);
  absl::StatusOr<std::unique_ptr<PolicyCodec>> param_policy =
      PolicyCodec::Create(tensor_sizes, po);
  if (!param_policy.ok()) return Fail(param_policy.status(), 2);
  po.trailing_fp32 = 2;  // the averaging weight and the stop vote
  absl::StatusOr<std::unique_ptr<PolicyCodec>> ring_policy =
      PolicyCodec::Create(tensor_sizes, po);
  if (!ring_policy.ok()) return Fail(ring_policy.status(), 2);
  const PolicyCodec* ring_codec =
      compression == "fp32" ? nullptr : ring_policy->get();
  const std::string ef_flag = absl::GetFlag(FLAGS_error_feedback);
  if (ef_flag != "auto" && ef_flag != "on" && ef_flag != "off") {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--error_feedback=", ef_flag,
                                                ": expected auto, on or off")),
        2);
  }
  const bool use_ef =
      !(*param_policy)->lossless() &&
      (ef_flag == "on" ||
       (ef_flag == "auto" && ErrorFeedbackByDefault(compression)));
  std::unique_ptr<ErrorFeedback> feedback =
      use_ef ? std::make_unique<ErrorFeedback>(n_params) : nullptr;

  int64_t round = 0;
  // Traffic of earlier sessions of a resumed run: sent, received, and the
  // pseudo-gradient bytes before/after compression.
  int64_t prior[4] = {0, 0, 0, 0};
  std::vector<RoundRecord> rounds;
  if (config.resume()) {
    std::map<std::string, std::string> sections;
    absl::Status s = trainer.RestoreCheckpoint(ckpt_path, &sections);
    if (s.ok() && algo == "diloco") s = (*outer)->LoadState(sections["outer"]);
    if (s.ok() && feedback) s = feedback->LoadState(sections["error_feedback"]);
    if (!s.ok()) return Fail(s, ExitCodeFor(s));
    absl::SimpleAtoi(sections["round"], &round);
    std::vector<std::string> comm = absl::StrSplit(sections["comm"], ',');
    for (size_t i = 0; i < comm.size() && i < 4; ++i) {
      (void)absl::SimpleAtoi(comm[i], &prior[i]);
    }
    // Rounds before the checkpoint, as this node logged them.
    rounds = ReadRoundEvents(absl::StrCat(out, "/events.jsonl"), round);
    if (trainer.state().step() >= config.steps()) {
      // Finished already: keep its summary.json as it is.
      WriteStderrLine(absl::StrCat("starling node: the run in ", out,
                                   " is already complete (",
                                   trainer.state().step(), " steps)"));
      return 0;
    }
  }
  std::vector<float> theta_global = Flatten(params);
  const std::string init_hash =
      ModelHash(params);  // every member must start from the same θ

  const std::string node_id = absl::StrCat("n", rank);
  EventLog events(absl::StrCat(out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  STARLING_LOG(INFO) << node_id << " of " << world << " (" << algo << "), "
                     << trainer.model().Architecture() << ", " << n_params
                     << " parameters, data " << trainer.dataset().Describe();

  // The network: none for a single member.
  std::unique_ptr<GrpcTransport> transport;
  if (world > 1) {
    GrpcTransportOptions to;
    to.listen = membership->members[rank];
    to.chunk_bytes = chunk;
    to.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
    PeerIdentity id;
    id.run_id = absl::GetFlag(FLAGS_run_id);
    id.algo = algo;
    id.world = world;
    id.compression = algo == "diloco" ? (*ring_policy)->Name() : "fp32";
    id.model =
        MakeFingerprint(trainer.model().Architecture(), n_params, init_hash);
    absl::StatusOr<std::unique_ptr<GrpcTransport>> t =
        GrpcTransport::Start(to, id);
    if (!t.ok()) return Fail(t.status(), 1);
    transport = std::move(t).value();
    MailboxOptions mo;
    mo.run_id = id.run_id;
    mo.tensors = {{kPseudoGrad, n_params + 2}, {kGrad, n_params + 2}};
    mo.first_round = round;
    if (ring_codec != nullptr) {
      mo.compressed_bytes_per_element = {{kPseudoGrad, 8}};
    }
    STARLING_LOG(INFO) << "listening on " << transport->address()
                       << "; connecting to " << world - 1 << " peers";
    absl::Status s = transport->Connect(
        membership->members, rank, mo,
        absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_connect_timeout)));
    if (!s.ok()) return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
    transport->mailbox().AdvanceRound(round);
  }
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("rank", static_cast<int64_t>(rank))
                   .Add("world", static_cast<int64_t>(world))
                   .Add("algo", algo)
                   .Add("round", round)
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", n_params)
                   .Add("model_hash", init_hash));
  InstallStopSignals();

  RingOptions ring;
  ring.step_timeout = absl::Seconds(absl::GetFlag(FLAGS_round_timeout));
  auto bytes_sent = [&] {
    return prior[0] + (transport ? transport->bytes_sent() : 0);
  };
  auto bytes_received = [&] {
    return prior[1] + (transport ? transport->bytes_received() : 0);
  };
  std::vector<int> all_members(world);
  for (int r = 0; r < world; ++r) all_members[r] = r;

  EvalResult eval;
  int evaluated_step = -1;
  auto maybe_evaluate = [&](bool force, int prev_step) -> absl::Status {
    const int step = trainer.state().step();
    const int every = config.eval_every();
    bool due = every > 0 && step / every > prev_step / every;
    if (rank != 0 || !(due || force) || evaluated_step == step) {
      return absl::OkStatus();
    }
    STARLING_ASSIGN_OR_RETURN(eval, trainer.Evaluate());
    evaluated_step = step;
    JsonObject f;
    f.Add("step", static_cast<int64_t>(step)).Add("val_loss", eval.loss);
    if (eval.accuracy >= 0) f.Add("val_accuracy", eval.accuracy);
    events.Write("eval", f);
    WriteStderrLine(absl::StrFormat("eval  step %d/%d | val_loss %.4f", step,
                                    config.steps(), eval.loss));
    return absl::OkStatus();
  };
  RingStats ring_stats;
  auto checkpoint = [&](int64_t next_round) -> absl::Status {
    trainer.set_wall_seconds(events.WallSeconds());
    std::map<std::string, std::string> extra = {
        {"outer", (*outer)->SaveState()},
        {"round", absl::StrCat(next_round)},
        {"comm", absl::StrCat(bytes_sent(), ",", bytes_received(), ",",
                              prior[2] + ring_stats.raw_bytes, ",",
                              prior[3] + ring_stats.wire_bytes)}};
    if (feedback) extra["error_feedback"] = feedback->SaveState();
    return trainer.SaveCheckpoint(ckpt_path, extra);
  };

  bool interrupted = false;
  const int total = config.steps();
  const int per_round = algo == "ddp" ? 1 : h;
  const int64_t n_rounds = (total + per_round - 1) / per_round;
  double compute_window = 0;
  // SIGINT/SIGTERM: a single node stops before its next step; members vote
  // in every all-reduce, so they all stop after the same round and resume
  // together from matching checkpoints.
  bool stop_voted = false;
  auto vote = [&] {
    return std::vector<float>{StopSignal() != 0 ? 1.0f : 0.0f};
  };
  while (trainer.state().step() < total) {
    if (!transport && StopSignal() != 0) {
      interrupted = true;
      break;
    }
    const auto round_start = absl::Now();
    const int64_t sent_before = bytes_sent();
    const int prev_step = trainer.state().step();
    const int steps = std::min(per_round, total - prev_step);
    if (transport) transport->mailbox().AdvanceRound(round);
    double loss_sum = 0;
    int64_t samples = 0;
    Trainer::GradientHook hook = nullptr;
    if (algo == "ddp" && world > 1) {
      hook = [&](const std::vector<torch::Tensor>& ps) -> absl::Status {
        std::vector<float> g = FlattenGrads(ps);
        RingOptions o = ring;
        o.tensor = kGrad;
        o.round = round;
        std::vector<float> votes = vote();
        o.extra_sums = &votes;
        STARLING_RETURN_IF_ERROR(RingWeightedAverage(
            *transport, g, static_cast<double>(config.batch()), o));
        stop_voted = stop_voted || votes[0] > 0;
        return UnflattenGrads(g, ps);
      };
    }
    for (int i = 0; i < steps; ++i) {
      absl::StatusOr<StepResult> r = trainer.Step(hook);
      if (!r.ok()) {
        events.Write("error",
                     JsonObject().Add("message", r.status().message()));
        return Fail(r.status(), 1);
      }
      loss_sum += r->loss;
      samples += r->samples;
      compute_window += r->seconds;
    }
    if (algo == "diloco") {
      // Δ = θ_global − θ_local, averaged with sample weights over the ring.
      std::vector<float> delta = Flatten(params);
      for (size_t i = 0; i < delta.size(); ++i) {
        delta[i] = theta_global[i] - delta[i];
      }
      if (feedback) {
        // Error feedback: send C(Δ + e), keep e ← (Δ + e) − C(Δ + e).
        std::vector<float> sent(delta.size());
        absl::StatusOr<std::string> enc =
            feedback->Compress(**param_policy, delta, absl::MakeSpan(sent));
        if (!enc.ok()) return Fail(enc.status(), 1);
        delta = std::move(sent);
      }
      if (transport) {
        RingOptions o = ring;
        o.tensor = kPseudoGrad;
        o.round = round;
        o.codec = ring_codec;
        o.stats = &ring_stats;
        std::vector<float> votes = vote();
        o.extra_sums = &votes;
        absl::Status s = RingWeightedAverage(*transport, delta,
                                             static_cast<double>(samples), o);
        stop_voted = stop_voted || (s.ok() && votes[0] > 0);
        if (!s.ok()) {
          events.Write("error", JsonObject().Add("message", s.message()));
          return Fail(s, 1);  // θ_global is untouched: no partial update
        }
      }
      if (absl::Status s = (*outer)->Step(absl::MakeSpan(theta_global), delta);
          !s.ok()) {
        return Fail(s, 1);
      }
      if (absl::Status s = Unflatten(theta_global, params); !s.ok()) {
        return Fail(s, 1);
      }
    }
    RoundRecord rec;
    rec.round = round;
    rec.step = trainer.state().step();
    rec.members = all_members;
    // After the outer step the weights are θ_global's bytes; ddp hashes them.
    rec.model_hash =
        algo == "diloco" ? FlatHash(theta_global) : ModelHash(params);
    rec.train_loss = loss_sum / steps;
    rec.bytes = bytes_sent() - sent_before;
    rec.seconds = absl::ToDoubleSeconds(absl::Now() - round_start);
    ++round;
    if (absl::Status s = maybe_evaluate(rec.step == total, prev_step);
        !s.ok()) {
      return Fail(s, 1);
    }
    if (evaluated_step == rec.step) rec.val_loss = eval.loss;
    events.Write("round", RoundJson(rec));
    rounds.push_back(rec);
    const bool log_now =
        algo == "diloco" ||
        (config.log_every() > 0 && rec.step % config.log_every() == 0) ||
        rec.step == total;
    if (log_now) {
      double elapsed = events.WallSeconds();
      double eta = rec.step > 0 ? elapsed * (total - rec.step) / rec.step : 0;
      WriteStderrLine(absl::StrFormat(
          "%s round %d/%d | step %d/%d | loss %.4f | sent %s | hash %s | eta "
          "%s",
          node_id, round, n_rounds, rec.step, total, rec.train_loss,
          FormatBytes(static_cast<double>(bytes_sent())),
          rec.model_hash.substr(0, 8), FormatDuration(eta)));
    }
    if (config.checkpoint_every() > 0 &&
        rec.step / config.checkpoint_every() >
            prev_step / config.checkpoint_every() &&
        rec.step < total) {
      if (absl::Status s = checkpoint(round); !s.ok()) return Fail(s, 1);
    }
    if (stop_voted && rec.step < total) {
      interrupted = true;
      break;
    }
  }
  if (absl::Status s = checkpoint(round); !s.ok()) return Fail(s, 1);

  NodeTotals totals;
  totals.id = node_id;
  totals.bytes_sent = bytes_sent();
  totals.bytes_received = bytes_received();
  totals.wall_seconds = events.WallSeconds();
  if (algo == "diloco") {
    totals.compression = (*ring_policy)->Name();
    if (use_ef) totals.compression += " + error feedback";
    totals.bytes_before_compression = prior[2] + ring_stats.raw_bytes;
    totals.bytes_after_compression = prior[3] + ring_stats.wire_bytes;
  }
  // Per-step ring all-reduce of fp32 gradients: 2·(N−1)/N · P · 4 bytes.
  totals.allreduce_equivalent_bytes = static_cast<int64_t>(
      static_cast<double>(trainer.state().step()) * 2.0 * (world - 1) / world *
      static_cast<double>(n_params) * 4.0);
  JsonObject extra;
  extra.Add("algo", algo)
      .Add("rank", static_cast<int64_t>(rank))
      .Add("world", static_cast<int64_t>(world))
      .Add("inner_steps_per_round", static_cast<int64_t>(per_round));
  events.Write(interrupted ? "interrupted" : "end",
               JsonObject()
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("round", round)
                   .Add("bytes_sent", totals.bytes_sent));
  if (absl::Status s = WriteNodeSummary(out, "node", trainer, eval, totals,
                                        rounds, interrupted, extra);
      !s.ok()) {
    return Fail(s, 1);
  }
  if (transport) transport->Shutdown();
  if (interrupted) {
    WriteStderrLine(absl::StrCat(
        "starling node: interrupted by signal ", StopSignal(), " at step ",
        trainer.state().step(), "; checkpoint in ", ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat("%s done: %d steps in %d rounds, sent %s",
                                  node_id, trainer.state().step(), round,
                                  FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace starling
