#include "gossip/relay_plan.h"

#include <algorithm>
#include <cstdint>

namespace starling {

std::string PickRelay(const std::vector<peer::v1::MemberEntry>& table,
                      const std::string& self,
                      const std::map<std::string, std::string>& relay_of,
                      const std::set<std::string>& avoid) {
  std::map<std::string, int> load;
  for (const auto& [member, relay] : relay_of) {
    if (member != self) ++load[relay];
  }
  std::vector<std::string> least;  // the least loaded candidates, by id
  int least_load = 0;
  for (const peer::v1::MemberEntry& e : table) {  // sorted by id
    if (e.id() == self || e.state() != peer::v1::MEMBER_ALIVE ||
        e.reachability() != peer::v1::REACHABILITY_REACHABLE ||
        avoid.count(e.id()) > 0) {
      continue;
    }
    const int l = load[e.id()];
    if (least.empty() || l < least_load) {
      least = {e.id()};
      least_load = l;
    } else if (l == least_load) {
      least.push_back(e.id());
    }
  }
  if (least.empty()) return "";
  // Members that choose at once (joined together) see the same loads: a
  // hash of each one's id spreads them over the tie.
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : self) h = (h ^ c) * 1099511628211ull;
  return least[h % least.size()];
}

std::vector<std::string> RelayRingOrder(
    std::vector<std::string> ids,
    const std::map<std::string, std::string>& relay_of) {
  std::sort(ids.begin(), ids.end());
  const std::set<std::string> present(ids.begin(), ids.end());
  // Relayed members whose relay takes part: placed after it, in id order.
  std::map<std::string, std::vector<std::string>> after;
  std::vector<std::string> order;
  for (const std::string& id : ids) {
    auto it = relay_of.find(id);
    if (it != relay_of.end() && it->second != id &&
        present.count(it->second) > 0 && relay_of.count(it->second) == 0) {
      after[it->second].push_back(id);
    } else {
      order.push_back(id);
    }
  }
  std::vector<std::string> ring;
  for (const std::string& id : order) {
    ring.push_back(id);
    for (const std::string& relayed : after[id]) ring.push_back(relayed);
  }
  return ring;
}

}  // namespace starling
