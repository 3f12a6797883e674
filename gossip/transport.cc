#include "gossip/transport.h"

#include "absl/strings/str_cat.h"

namespace starling {

absl::Status Transport::SendPayload(int to, const Message& header,
                                    absl::string_view payload,
                                    const std::shared_ptr<const void>&,
                                    absl::Time deadline) {
  Message m = header;
  m.payload.assign(payload.data(), payload.size());
  return Send(to, m, deadline);
}

class InProcessNetwork::Endpoint : public Transport {
 public:
  Endpoint(InProcessNetwork* net, int rank) : net_(net), rank_(rank) {}
  int rank() const override { return rank_; }
  int world() const override {
    return static_cast<int>(net_->mailboxes_.size());
  }
  absl::Status Send(int to, const Message& m, absl::Time) override {
    if (to < 0 || to >= world()) {
      return absl::InvalidArgumentError(absl::StrCat("no rank ", to));
    }
    absl::Status s = net_->mailboxes_[to]->Deliver(m);
    if (s.ok()) {
      sent_ += static_cast<int64_t>(m.payload.size());
      static_cast<Endpoint*>(net_->transports_[to].get())->received_ +=
          static_cast<int64_t>(m.payload.size());
    }
    return s;
  }
  Mailbox& mailbox() override { return *net_->mailboxes_[rank_]; }
  int64_t bytes_sent() const override { return sent_.load(); }
  int64_t bytes_received() const override { return received_.load(); }

 private:
  InProcessNetwork* net_;
  int rank_;
  std::atomic<int64_t> sent_{0};
  std::atomic<int64_t> received_{0};
};

InProcessNetwork::InProcessNetwork(int world, const MailboxOptions& options) {
  for (int r = 0; r < world; ++r) {
    MailboxOptions o = options;
    o.rank = r;
    o.world = world;
    mailboxes_.push_back(std::make_unique<Mailbox>(o));
  }
  for (int r = 0; r < world; ++r) {
    transports_.push_back(std::make_unique<Endpoint>(this, r));
  }
}

}  // namespace starling
