#include "node/consensus.h"

#include <dirent.h>
#include <unistd.h>

#include <cstring>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "core/file_util.h"

namespace starling {

absl::StatusOr<double> ConsensusDistance(
    const std::vector<std::vector<float>>& models) {
  if (models.size() < 2) return 0.0;
  const size_t dim = models[0].size();
  for (size_t k = 1; k < models.size(); ++k) {
    if (models[k].size() != dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("consensus distance: model ", k, " has ",
                       models[k].size(), " values, model 0 has ", dim));
    }
  }
  const double n = static_cast<double>(models.size());
  double total = 0;
  for (size_t i = 0; i < dim; ++i) {
    double mean = 0;
    for (const auto& m : models) mean += m[i];
    mean /= n;
    for (const auto& m : models) {
      const double d = m[i] - mean;
      total += d * d;
    }
  }
  return total / n;
}

namespace {

// step -> file, for the step_<S>.bin files in `dir`.
std::map<int64_t, std::string> SnapshotFiles(const std::string& dir) {
  std::map<int64_t, std::string> files;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return files;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    if (!absl::ConsumePrefix(&name, "step_") ||
        !absl::ConsumeSuffix(&name, ".bin")) {
      continue;
    }
    int64_t step = 0;
    if (absl::SimpleAtoi(name, &step)) {
      files[step] = absl::StrCat(dir, "/", e->d_name);
    }
  }
  closedir(d);
  return files;
}

}  // namespace

std::vector<ConsensusPoint> ConsensusFromSnapshots(
    const std::vector<std::string>& node_dirs, bool remove,
    std::vector<std::string>* skipped) {
  std::map<int64_t, std::vector<std::string>> by_step;
  for (const std::string& nd : node_dirs) {
    for (const auto& [step, path] : SnapshotFiles(nd + "/snapshots")) {
      by_step[step].push_back(path);
    }
  }
  std::vector<ConsensusPoint> points;
  for (const auto& [step, paths] : by_step) {
    std::vector<std::vector<float>> models;
    for (const std::string& p : paths) {
      absl::StatusOr<std::string> bytes = ReadFile(p);
      if (!bytes.ok() || bytes->size() % sizeof(float) != 0 || bytes->empty() ||
          (!models.empty() &&
           bytes->size() != models[0].size() * sizeof(float))) {
        if (skipped) skipped->push_back(p);
        continue;
      }
      std::vector<float> m(bytes->size() / sizeof(float));
      std::memcpy(m.data(), bytes->data(), bytes->size());
      models.push_back(std::move(m));
    }
    if (models.size() >= 2) {
      absl::StatusOr<double> d = ConsensusDistance(models);
      if (d.ok()) {
        points.push_back({step, *d, static_cast<int>(models.size())});
      }
    }
  }
  if (remove) {
    for (const auto& [step, paths] : by_step) {
      for (const std::string& p : paths) ::unlink(p.c_str());
    }
    for (const std::string& nd : node_dirs) {
      ::rmdir((nd + "/snapshots").c_str());
    }
  }
  return points;
}

}  // namespace starling
