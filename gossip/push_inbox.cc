#include "gossip/push_inbox.h"

#include <algorithm>
#include <utility>

namespace starling {

PushInbox::PushInbox(int capacity) : capacity_(std::max(1, capacity)) {}

int64_t PushInbox::Reserve() {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(pushes_.size() + receiving_.size()) >= capacity_) {
    return -1;
  }
  const int64_t ticket = next_ticket_++;
  receiving_.insert(ticket);
  return ticket;
}

void PushInbox::End(int64_t ticket, ReceivedPush* push) {
  absl::MutexLock lock(&mu_);
  if (receiving_.erase(ticket) == 0) return;
  if (push != nullptr) pushes_.push_back(std::move(*push));
}

std::vector<ReceivedPush> PushInbox::Take() {
  std::vector<ReceivedPush> out;
  absl::MutexLock lock(&mu_);
  out.swap(pushes_);
  return out;
}

}  // namespace starling
