#include "gossip/relay_attachment.h"

#include <sys/socket.h>

#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/logging.h"
#include "gossip/grpc_transport.h"
#include "gossip/peer_limits.h"
#include "gossip/relay_plan.h"
#include "starling/peer/v1/relay.grpc.pb.h"

namespace starling {
namespace {

constexpr char kAttach[] = "/starling.peer.v1.Relay/Attach";
constexpr char kAccept[] = "/starling.peer.v1.Relay/Accept";

}  // namespace

RelayAttachment::RelayAttachment(RelayAttachmentOptions options,
                                 Membership* membership,
                                 const std::atomic<bool>* stopping)
    : options_(std::move(options)),
      membership_(membership),
      stopping_(stopping) {}

void RelayAttachment::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void RelayAttachment::Join() {
  if (thread_.joinable()) thread_.join();
  tunnels_.StopAll();
}

std::string RelayAttachment::relay() const {
  absl::MutexLock lock(&mu_);
  return relay_;
}

void RelayAttachment::SetRelay(const std::string& relay) {
  {
    absl::MutexLock lock(&mu_);
    relay_ = relay;
  }
  membership_->SetRelay(relay);
}

std::string RelayAttachment::Choose(const std::set<std::string>& avoid) const {
  if (options_.mode != "auto") return options_.mode;
  const std::vector<peer::v1::MemberEntry> table = membership_->Snapshot();
  std::map<std::string, std::string> id_at, relay_of;
  std::set<std::string> avoid_ids;
  for (const peer::v1::MemberEntry& e : table) id_at[e.address()] = e.id();
  for (const peer::v1::MemberEntry& e : table) {
    if (e.relay().empty()) continue;
    if (auto it = id_at.find(e.relay()); it != id_at.end()) {
      relay_of[e.id()] = it->second;
    }
  }
  for (const std::string& a : avoid) {
    if (auto it = id_at.find(a); it != id_at.end())
      avoid_ids.insert(it->second);
  }
  const std::string id =
      PickRelay(table, options_.node_id, relay_of, avoid_ids);
  for (const peer::v1::MemberEntry& e : table) {
    if (e.id() == id) return e.address();
  }
  return "";
}

void RelayAttachment::Loop() {
  std::set<std::string> avoid;
  bool told_none = false;
  while (!stopping_->load()) {
    absl::StatusOr<peer::v1::MemberEntry> self =
        membership_->Get(options_.node_id);
    if (options_.mode == "off" || !self.ok() ||
        self->reachability() != peer::v1::REACHABILITY_UNREACHABLE) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    const std::string relay = Choose(avoid);
    if (relay.empty()) {
      if (!avoid.empty()) {
        avoid.clear();  // every relay failed once: try them all again
        continue;
      }
      if (!told_none) {
        LogEvent(LogLevel::kWarning, "relay_none",
                 "no reachable member to relay through yet; peers cannot "
                 "reach this node until one joins");
        told_none = true;
      }
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    told_none = false;
    bool attached = false;
    const absl::Status why = AttachOnce(relay, &attached);
    if (stopping_->load()) break;
    const std::string next =
        options_.mode == "auto" ? "; choosing another" : "; retrying";
    if (attached) {
      lost_.fetch_add(1);
      LogEvent(LogLevel::kWarning, "relay_lost",
               absl::StrCat("lost relay ", relay, ": ", why.message(), next),
               {{"peer", relay}});
    } else {
      // A relay that has not heard of this node's join yet refuses it:
      // not worth a warning each time.
      LogRefusal(
          "relay_refused", relay,
          absl::StrCat("relay ", relay, " refused: ", why.message(), next));
    }
    avoid.insert(relay);
    absl::SleepFor(attached ? absl::Milliseconds(100)
                            : absl::Milliseconds(300));
  }
}

absl::Status RelayAttachment::AttachOnce(const std::string& relay,
                                         bool* attached) {
  *attached = false;
  grpc::ChannelArguments args;
  options_.credentials.Apply(&args);
  SetReconnectBackoff(args);
  std::shared_ptr<peer::v1::Relay::Stub> stub = peer::v1::Relay::NewStub(
      grpc::CreateCustomChannel(relay, options_.credentials.channel, args));
  grpc::ClientContext ctx;
  options_.credentials.Sign(&ctx, kAttach);
  peer::v1::AttachRequest request;
  request.set_run_id(options_.run_id);
  request.set_node_id(options_.node_id);
  std::unique_ptr<grpc::ClientReader<peer::v1::RelayEvent>> events =
      stub->Attach(&ctx, request);
  // The relay sends a keepalive every second: silence means it is gone
  // (a host asleep or cut off leaves the stream open for minutes).
  std::atomic<int64_t> last_ms{absl::ToUnixMillis(absl::Now())};
  std::atomic<bool> done{false};
  std::atomic<bool> silent{false};
  const int64_t timeout_ms =
      absl::ToInt64Milliseconds(options_.keepalive_timeout);
  std::thread watchdog([&] {
    while (!done.load()) {
      const bool quiet =
          absl::ToUnixMillis(absl::Now()) - last_ms.load() > timeout_ms;
      if (stopping_->load() || quiet) {
        silent.store(quiet);
        ctx.TryCancel();
        return;
      }
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  peer::v1::RelayEvent e;
  while (events->Read(&e)) {
    last_ms.store(absl::ToUnixMillis(absl::Now()));
    if (!*attached) {  // the first event: the relay took this node
      *attached = true;
      SetRelay(relay);
      LogEvent(LogLevel::kInfo, "relay_attached",
               absl::StrCat("attached to relay ", relay,
                            ": peers reach this node through it"),
               {{"peer", relay}});
    }
    if (e.conn() == 0) continue;
    absl::StatusOr<int> fd = DialTcp(options_.local);
    if (!fd.ok()) {
      STARLING_LOG(WARNING) << "relay " << relay << ": " << fd.status();
      continue;
    }
    const uint64_t conn = e.conn();
    tunnels_.Start(*fd, [this, stub, conn](Tunnel* t) {
      options_.credentials.Sign(&t->ctx, kAccept);
      std::unique_ptr<RelayStream> stream = stub->Accept(&t->ctx);
      peer::v1::RelayFrame first;
      first.set_run_id(options_.run_id);
      first.set_conn(conn);
      if (stream->Write(first)) Pump(t, stream.get(), &bytes_);
      t->ctx.TryCancel();
      stream->Finish();
    });
  }
  done.store(true);
  watchdog.join();
  const grpc::Status s = events->Finish();
  SetRelay("");
  if (s.ok()) return absl::UnavailableError("the relay ended the stream");
  if (silent.load()) {
    return absl::UnavailableError(absl::StrCat(
        "no keepalive for ", absl::FormatDuration(options_.keepalive_timeout)));
  }
  return absl::UnavailableError(s.error_message());
}

}  // namespace starling
