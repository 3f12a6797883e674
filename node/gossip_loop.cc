#include "node/gossip_loop.h"

#include <random>

#include "node/node_flags.h"

namespace starling {
namespace {

// Writes y as flat little-endian fp32 to OUT/snapshots/step_<S>.bin, for
// `starling sim`'s consensus distance (node/consensus.h).
absl::Status WriteSnapshot(const std::string& out, int step,
                           const std::vector<float>& y) {
  const std::string dir = absl::StrCat(out, "/snapshots");
  STARLING_RETURN_IF_ERROR(MakeDirs(dir));
  return WriteFileAtomic(
      absl::StrCat(dir, "/step_", step, ".bin"),
      absl::string_view(reinterpret_cast<const char*>(y.data()),
                        y.size() * sizeof(float)));
}

}  // namespace

// Asynchronous push-sum gossip (SGP) over a Swarm's membership: no rounds,
// no barrier, no quorum. After every --inner_steps local steps a node
// absorbs the pushes it received, then pushes (y, w/2) to one live peer
// (gossip/push_sum.h), trying another when a push fails.
int RunGossip(NodeRun& run) {
  Trainer& trainer = *run.trainer;
  const TrainConfig& config = run.config;
  absl::StatusOr<SwarmOptions> shared = SharedSwarmOptions(run, "gossip");
  if (!shared.ok()) return Fail(shared.status(), 2);
  SwarmOptions so = std::move(shared).value();
  const std::string node_id = so.node_id;
  const std::string peer_mode = absl::GetFlag(FLAGS_gossip_peers);
  if (peer_mode != "random" && peer_mode != "exponential") {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat(
            "--gossip_peers=", peer_mode, ": expected random or exponential")),
        2);
  }
  const double push_timeout_s = absl::GetFlag(FLAGS_gossip_timeout);
  const double beta = absl::GetFlag(FLAGS_gossip_momentum);
  const double alpha = absl::GetFlag(FLAGS_gossip_outer_lr);
  const int snapshot_every = absl::GetFlag(FLAGS_snapshot_every);
  const int min_members = absl::GetFlag(FLAGS_min_members);
  const bool lossy = !run.param_policy->lossless();
  const Codec* codec = lossy ? run.param_policy.get() : nullptr;
  // What each peer holds of this node's last push to it (lossy pushes).
  std::map<std::string, PublicCopy> public_copies;

  EventLog events(absl::StrCat(run.out, "/events.jsonl"), node_id,
                  trainer.state().wall_seconds());
  MemberChanges changes(so.node_id);
  so.identity.compression = run.param_policy->Name();
  so.push_elements = run.n_params;
  so.push_codec = lossy ? run.param_policy.get() : nullptr;
  so.push_timeout = absl::Seconds(push_timeout_s);
  so.on_member_change = [&](const MembershipChange& c) { changes.Add(c); };
  absl::StatusOr<std::unique_ptr<Swarm>> started = Swarm::Start(so);
  if (!started.ok()) {
    return Fail(started.status(),
                absl::IsInvalidArgument(started.status()) ? 2 : 1);
  }
  Swarm& swarm = **started;
  auto bytes_sent = [&] { return run.prior[0] + swarm.bytes_sent(); };
  auto bytes_received = [&] { return run.prior[1] + swarm.bytes_received(); };
  auto log_changes = [&] { changes.Log(events); };
  STARLING_LOG(INFO) << node_id << " (gossip, push-sum) listening on "
                     << swarm.address() << ", "
                     << trainer.model().Architecture() << ", " << run.n_params
                     << " parameters, data " << trainer.dataset().Describe();
  const absl::Duration connect =
      absl::Seconds(absl::GetFlag(FLAGS_connect_timeout));
  NodeOps& ops = *run.ops;
  ops.watchdog->Waiting(2 * connect);
  if (absl::Status s = swarm.JoinSwarm(absl::Now() + connect); !s.ok()) {
    events.Write("error", JsonObject().Add("message", s.message()));
    return Fail(s, absl::IsFailedPrecondition(s) ? 2 : 1);
  }
  // Only now do the others count this node towards --min_members: counted
  // earlier (they hear of it from its first gossip), they could train and
  // leave while it is still in JoinSwarm, and it would wait for them in vain.
  swarm.SetProgress({}, /*joining=*/false);
  if (absl::Status s = swarm.WaitForMembers(min_members, absl::Now() + connect);
      !s.ok()) {
    return Fail(s, 1);
  }
  PushSum push_sum(1.0);
  if (run.gossip_weight > 0) push_sum.set_weight(run.gossip_weight);
  std::vector<float> y = Flatten(run.params);
  events.Write(config.resume() ? "resume" : "start",
               JsonObject()
                   .Add("algo", "gossip")
                   .Add("address", swarm.address())
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("parameters", run.n_params)
                   .Add("weight", push_sum.weight())
                   .Add("model_hash", FlatHash(y)));
  InstallStopSignals();

  // SlowMo-style outer momentum on the gossiped update (off when β = 0 and
  // α = 1): anchor x0 is the model after the previous gossip.
  const bool momentum = beta > 0 || alpha != 1;
  std::vector<float> x0, u;
  if (momentum) {
    x0 = y;
    u.assign(y.size(), 0.0f);
  }
  std::mt19937_64 rng(std::hash<std::string>()(node_id) ^
                      static_cast<uint64_t>(config.seed()));
  const absl::Duration push_timeout = absl::Seconds(push_timeout_s);
  int64_t exchanges = 0, pushes = 0, absorbs = 0, failed_pushes = 0;
  int64_t raw_bytes = 0, wire_bytes = 0;
  int exp_step = 0;  // exponential graph: the next offset's exponent
  const int total = config.steps();
  bool left = false;

  auto absorb_inbox = [&]() -> absl::Status {
    for (ReceivedPush& p : swarm.TakePushes()) {
      absl::StatusOr<double> d2 =
          push_sum.Absorb(absl::MakeSpan(y), p.values, p.weight);
      if (!d2.ok()) {
        LogEvent(LogLevel::kWarning, "exchange",
                 absl::StrCat("dropped a push from ", p.from, ": ",
                              d2.status().message()));
        continue;
      }
      ++exchanges;
      ++absorbs;
      if (ops.metrics) ops.metrics->SetConsensusDistance(*d2);
      events.Write(
          "exchange",
          JsonObject()
              .Add("kind", "absorb")
              .Add("peer", p.from)
              .Add("step", static_cast<int64_t>(trainer.state().step()))
              .Add("weight", push_sum.weight())
              .Add("bytes", p.wire_bytes)
              .Add("distance2", *d2));
    }
    return absl::OkStatus();
  };

  // Peers to try for one push, best first: the exponential graph's next
  // neighbour (offsets 2^0, 2^1, ... over the sorted live ids, cycling) or a
  // random order; at most three tries.
  int max_world = 1;  // the most members seen alive, for the summary
  auto candidates = [&]() {
    std::vector<std::string> peers = swarm.AlivePeers();
    max_world = std::max(max_world, static_cast<int>(peers.size()) + 1);
    std::shuffle(peers.begin(), peers.end(), rng);
    if (peer_mode == "exponential" && !peers.empty()) {
      std::vector<std::string> ids = swarm.AlivePeers();
      ids.push_back(node_id);
      std::sort(ids.begin(), ids.end());
      const int n = static_cast<int>(ids.size());
      const int me = static_cast<int>(
          std::find(ids.begin(), ids.end(), node_id) - ids.begin());
      int levels = 0;
      while ((1 << levels) < n) ++levels;
      const int offset = 1 << (exp_step % std::max(1, levels));
      ++exp_step;
      const std::string& first = ids[(me + offset) % n];
      auto it = std::find(peers.begin(), peers.end(), first);
      if (it != peers.end()) std::rotate(peers.begin(), it, it + 1);
    }
    if (peers.size() > 3) peers.resize(3);
    return peers;
  };

  while (trainer.state().step() < total) {
    log_changes();
    ops.SetReady(StopSignal() == 0);
    const int prev_step = trainer.state().step();
    const int steps = std::min(run.h, total - prev_step);
    double loss_sum = 0;
    for (int i = 0; i < steps; ++i) {
      if (StopSignalCount() >= 2) break;  // a second signal: leave now
      absl::StatusOr<StepResult> r = StepOrLeave(trainer, events, swarm);
      if (!r.ok()) return Fail(r.status(), 1);
      loss_sum += r->loss;
      SetLogPosition(pushes, trainer.state().step());
      ops.Step(*r, trainer.state().step());
    }
    y = Flatten(run.params);
    if (absl::Status s = absorb_inbox(); !s.ok()) return Fail(s, 1);
    if (momentum) {
      for (size_t i = 0; i < y.size(); ++i) {
        u[i] = static_cast<float>(beta * u[i] + (x0[i] - y[i]));
        y[i] = static_cast<float>(x0[i] - alpha * u[i]);
      }
    }
    if (lossy) {
      // Copies for peers that left or died would grow with churn; one that
      // comes back is pushed to in full.
      for (const peer::v1::MemberEntry& e : swarm.Members()) {
        if (e.state() == peer::v1::MEMBER_DEAD ||
            e.state() == peer::v1::MEMBER_LEFT) {
          public_copies.erase(e.id());
        }
      }
    }
    std::vector<std::string> peers = candidates();
    for (const std::string& peer : peers) {
      // With a lossy codec, push y minus the copy `peer` holds of this
      // node's last push to it (its first push to a peer is absolute).
      absl::StatusOr<PushShare> share = push_sum.Share(
          absl::MakeSpan(y), codec, lossy ? &public_copies[peer] : nullptr);
      if (!share.ok()) {
        events.Write("error",
                     JsonObject().Add("message", share.status().message()));
        swarm.Leave();
        return Fail(share.status(), 1);
      }
      SetCrashRound(pushes + 1);
      ops.watchdog->Waiting(push_timeout);
      const int64_t sent_before = bytes_sent();
      int64_t sequence = 0;
      absl::Status s = swarm.Push(peer, *share, push_timeout, &sequence);
      if (!s.ok()) {
        push_sum.Restore(*share, absl::MakeSpan(y));
        if (!swarm.LinkError().ok()) {
          // An emulated link too slow for any push: retrying cannot help.
          // Keep this node's model, weight and what it absorbed first, as a
          // node leaving on a signal does: the senders gave that mass away.
          run.gossip_weight = push_sum.weight();
          run.CheckpointBeforeFailing(Unflatten(y, run.params), 0, bytes_sent(),
                                      bytes_received(), events.WallSeconds());
          events.Write("error", JsonObject().Add("message", s.message()));
          swarm.Leave();
          return Fail(s, 1);
        }
        // The peer lacks the copy this share was relative to (it restarted,
        // or took a push this node saw fail): the next push is absolute.
        if (absl::IsFailedPrecondition(s)) public_copies.erase(peer);
        ++failed_pushes;
        LogEvent(
            LogLevel::kInfo, "exchange",
            absl::StrCat("push failed, trying another peer: ", s.message()),
            {{"peer", peer}});
        continue;
      }
      ++pushes;
      ++exchanges;
      if (lossy) {
        public_copies[peer] = PublicCopy{sequence, std::move(share->sent)};
      }
      raw_bytes += run.n_params * static_cast<int64_t>(sizeof(float));
      wire_bytes += static_cast<int64_t>(share->payload.size());
      events.Write(
          "exchange",
          JsonObject()
              .Add("kind", "push")
              .Add("peer", peer)
              .Add("step", static_cast<int64_t>(trainer.state().step()))
              .Add("weight", push_sum.weight())
              .Add("bytes", bytes_sent() - sent_before)
              .Add("relative_to", share->base_sequence)
              .Add("train_loss", loss_sum / std::max(1, steps)));
      break;
    }
    if (momentum) x0 = y;
    if (absl::Status s = Unflatten(y, run.params); !s.ok()) return Fail(s, 1);
    const int step = trainer.state().step();
    if (absl::Status s = run.MaybeEvaluate(step == total, prev_step, events);
        !s.ok()) {
      return Fail(s, 1);
    }
    if (snapshot_every > 0 &&
        (step / snapshot_every > prev_step / snapshot_every || step == total)) {
      if (absl::Status s = WriteSnapshot(run.out, step, y); !s.ok()) {
        LogEvent(LogLevel::kWarning, "snapshot", std::string(s.message()));
      }
    }
    double elapsed = events.WallSeconds();
    double eta = step > 0 ? elapsed * (total - step) / step : 0;
    LogEvent(
        LogLevel::kInfo, "gossip",
        absl::StrFormat("%s step %d/%d | loss %.4f | w %.4f | pushes %d "
                        "absorbed %d | sent %s | eta %s",
                        node_id, step, total, loss_sum / std::max(1, steps),
                        push_sum.weight(), pushes, absorbs,
                        FormatBytes(static_cast<double>(bytes_sent())),
                        FormatDuration(eta)));
    run.gossip_weight = push_sum.weight();
    if (ops.metrics) {
      ops.metrics->SetTraffic(bytes_sent(), bytes_received(), raw_bytes,
                              wire_bytes);
      const int alive = static_cast<int>(swarm.AlivePeers().size());
      ops.metrics->SetPeers(alive, alive);
      ops.metrics->SetRpcErrors(swarm.rpc_errors());
      ops.metrics->SetRefusals(swarm.refusals());
    }
    if (config.checkpoint_every() > 0 &&
        step / config.checkpoint_every() >
            prev_step / config.checkpoint_every() &&
        step < total) {
      if (absl::Status s = run.Checkpoint(0, bytes_sent(), bytes_received(),
                                          events.WallSeconds());
          !s.ok()) {
        return Fail(s, 1);
      }
    }
    // SIGINT/SIGTERM: leave after the current local steps.
    if (StopSignal() != 0 && step < total) {
      left = true;
      break;
    }
  }
  log_changes();
  ops.SetReady(false);
  // Goodbye first, so that nobody pushes to this node any more.
  swarm.Leave();
  const int world = max_world;
  run.gossip_weight = push_sum.weight();
  if (left) {
    events.Write(
        "leave",
        JsonObject().Add("step", static_cast<int64_t>(trainer.state().step())));
  } else if (run.evaluated_step != trainer.state().step()) {
    if (absl::Status s =
            run.MaybeEvaluate(true, trainer.state().step(), events);
        !s.ok()) {
      return Fail(s, 1);
    }
  }
  if (absl::Status s = run.Checkpoint(0, bytes_sent(), bytes_received(),
                                      events.WallSeconds());
      !s.ok()) {
    return Fail(s, 1);
  }
  NodeTotals totals = run.Totals(node_id, bytes_sent(), bytes_received(),
                                 events.WallSeconds(), world);
  totals.compression = run.param_policy->Name();
  if (lossy) totals.compression += " + error feedback (gossip)";
  totals.bytes_before_compression = raw_bytes;
  totals.bytes_after_compression = wire_bytes;
  events.Write(left ? "interrupted" : "end",
               JsonObject()
                   .Add("step", static_cast<int64_t>(trainer.state().step()))
                   .Add("exchanges", exchanges)
                   .Add("bytes_sent", totals.bytes_sent));
  JsonObject extra;
  extra.Add("algo", "gossip")
      .Add("world", static_cast<int64_t>(world))
      .Add("inner_steps_per_round", static_cast<int64_t>(run.h))
      .Add("exchanges", exchanges)
      .Add("pushes", pushes)
      .Add("absorbs", absorbs)
      .Add("failed_pushes", failed_pushes)
      .Add("pushes_refused", swarm.pushes_refused())
      .Add("push_sum_weight", push_sum.weight());
  EvalResult final_eval = run.eval;
  if (run.evaluated_step != trainer.state().step()) final_eval = EvalResult();
  if (absl::Status s = WriteNodeSummary(run.out, "node", trainer, final_eval,
                                        totals, run.rounds, left, extra);
      !s.ok()) {
    return Fail(s, 1);
  }
  swarm.Shutdown();
  if (left) {
    WriteStderrLine(absl::StrCat("starling node: ", node_id,
                                 " left the swarm on signal ", StopSignal(),
                                 " at step ", trainer.state().step(),
                                 "; checkpoint in ", run.ckpt_path));
    return 1;
  }
  WriteStderrLine(absl::StrFormat(
      "%s done: %d steps, %d exchanges (%d pushes, %d absorbed), sent %s",
      node_id, trainer.state().step(), exchanges, pushes, absorbs,
      FormatBytes(totals.bytes_sent)));
  return 0;
}

}  // namespace starling
