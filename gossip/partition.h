// Emulated network partitions for tests and the sim (--partition_file): a
// file whose first line, when present, splits node ids into groups that
// cannot reach each other ("n0,n1|n2,n3"); an id in no group reaches
// everyone. The swarm rereads the file every gossip tick, and every call to
// a peer asks whether the partition separates it from this node.
// Thread-safe: one mutex guards the groups; the file is read and the change
// logged with it released.
#ifndef STARLING_GOSSIP_PARTITION_H_
#define STARLING_GOSSIP_PARTITION_H_

#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace starling {

// Node id -> group for the line "n0,n1|n2,n3" (whitespace around ids and
// the line ignored; empty: no partition).
std::map<std::string, int> ParsePartition(absl::string_view line);

class Partition {
 public:
  // `file`: the partition file ("": never partitioned).
  explicit Partition(std::string file) : file_(std::move(file)) {}

  // Rereads the file and logs a change ("network partition: LINE", or
  // "network partition healed").
  void Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Whether there is a partition at all (cheap: every send asks).
  bool active() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the partition puts `a` and `b` in different groups.
  bool Separates(const std::string& a, const std::string& b) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string file_;
  mutable absl::Mutex mu_;
  std::string line_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> groups_ ABSL_GUARDED_BY(mu_);
};

}  // namespace starling

#endif  // STARLING_GOSSIP_PARTITION_H_
