#include "core/optimizer_state.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace starling {
namespace {

namespace optim = torch::optim;

std::vector<torch::Tensor> ParamsOf(optim::Optimizer& opt) {
  std::vector<torch::Tensor> params;
  for (auto& group : opt.param_groups()) {
    for (const auto& p : group.params()) params.push_back(p);
  }
  return params;
}

// How torch::optim keys a parameter's state.
std::string StateKey(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

// What one parameter's entries hold: field name -> tensor.
using Fields = std::map<std::string, torch::Tensor>;

// The fields of each kind of state, and their conversion to and from the
// optimizer's state object. Adam and AdamW share theirs.
template <typename State>
struct AdamFields {
  static constexpr const char* kNames[] = {"step", "exp_avg", "exp_avg_sq",
                                           "max_exp_avg_sq"};
  static Fields Save(const State& s) {
    Fields f = {{"step", torch::scalar_tensor(s.step(), torch::kInt64)},
                {"exp_avg", s.exp_avg()},
                {"exp_avg_sq", s.exp_avg_sq()}};
    if (s.max_exp_avg_sq().defined()) f["max_exp_avg_sq"] = s.max_exp_avg_sq();
    return f;
  }
  // Null when a field that must be there is not (max_exp_avg_sq is there
  // when it was saved: with amsgrad).
  static std::unique_ptr<State> Load(Fields f) {
    if (!f.count("step") || !f.count("exp_avg") || !f.count("exp_avg_sq")) {
      return nullptr;
    }
    auto s = std::make_unique<State>();
    s->step(f["step"].item<int64_t>());
    s->exp_avg(f["exp_avg"]);
    s->exp_avg_sq(f["exp_avg_sq"]);
    if (f.count("max_exp_avg_sq")) s->max_exp_avg_sq(f["max_exp_avg_sq"]);
    return s;
  }
};

struct SgdFields {
  static constexpr const char* kNames[] = {"momentum_buffer"};
  static Fields Save(const optim::SGDParamState& s) {
    return {{"momentum_buffer", s.momentum_buffer()}};
  }
  static std::unique_ptr<optim::SGDParamState> Load(Fields f) {
    if (!f.count("momentum_buffer")) return nullptr;
    auto s = std::make_unique<optim::SGDParamState>();
    s->momentum_buffer(f["momentum_buffer"]);
    return s;
  }
};

template <typename State, typename Kind>
NamedTensors Save(optim::Optimizer& opt) {
  NamedTensors out;
  std::vector<torch::Tensor> params = ParamsOf(opt);
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = opt.state().find(StateKey(params[i]));
    if (it == opt.state().end()) continue;
    for (auto& [field, t] :
         Kind::Save(static_cast<const State&>(*it->second))) {
      out.emplace_back(absl::StrCat(i, ".", field), t);
    }
  }
  return out;
}

template <typename State, typename Kind>
absl::Status Load(ByteSource& in, optim::Optimizer& opt) {
  std::vector<torch::Tensor> params = ParamsOf(opt);
  std::map<size_t, Fields> loaded;
  auto bad = [](const TensorHeader& h, absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("optimizer state entry '", h.name, "' ", why));
  };
  // Each entry into a new tensor of its parameter's dtype and shape (or an
  // int64 scalar for a step count); the header is checked against it.
  auto destination =
      [&](const TensorHeader& h) -> absl::StatusOr<torch::Tensor> {
    const size_t dot = h.name.find('.');
    size_t i = 0;
    if (dot == std::string::npos ||
        !absl::SimpleAtoi(h.name.substr(0, dot), &i) || i >= params.size()) {
      return bad(h, absl::StrCat("names no parameter (there are ",
                                 params.size(), ")"));
    }
    const std::string field = h.name.substr(dot + 1);
    bool known = false;
    for (const char* name : Kind::kNames) known = known || field == name;
    if (!known) return bad(h, "names no field of this optimizer's state");
    if (loaded[i].count(field)) return bad(h, "appears twice");
    torch::Tensor t =
        field == "step" ? torch::empty({}, torch::kInt64)
                        : torch::empty(params[i].sizes(), params[i].options());
    loaded[i][field] = t;
    return t;
  };
  STARLING_RETURN_IF_ERROR(ReadTensors(in, destination));
  std::vector<std::pair<std::string, std::unique_ptr<State>>> states;
  for (auto& [i, fields] : loaded) {
    std::unique_ptr<State> s = Kind::Load(std::move(fields));
    if (s == nullptr) {
      return absl::DataLossError(
          absl::StrCat("optimizer state of parameter ", i, " is incomplete"));
    }
    states.emplace_back(StateKey(params[i]), std::move(s));
  }
  opt.state().clear();
  for (auto& [key, s] : states) opt.state()[key] = std::move(s);
  return absl::OkStatus();
}

absl::Status Unsupported() {
  return absl::InvalidArgumentError(
      "only Adam, AdamW and SGD optimizer state can be checkpointed");
}

}  // namespace

absl::StatusOr<NamedTensors> OptimizerStateTensors(optim::Optimizer& opt) {
  if (dynamic_cast<optim::AdamW*>(&opt) != nullptr) {
    return Save<optim::AdamWParamState, AdamFields<optim::AdamWParamState>>(
        opt);
  }
  if (dynamic_cast<optim::Adam*>(&opt) != nullptr) {
    return Save<optim::AdamParamState, AdamFields<optim::AdamParamState>>(opt);
  }
  if (dynamic_cast<optim::SGD*>(&opt) != nullptr) {
    return Save<optim::SGDParamState, SgdFields>(opt);
  }
  return Unsupported();
}

absl::Status ReadOptimizerState(ByteSource& in, optim::Optimizer& opt) {
  if (dynamic_cast<optim::AdamW*>(&opt) != nullptr) {
    return Load<optim::AdamWParamState, AdamFields<optim::AdamWParamState>>(
        in, opt);
  }
  if (dynamic_cast<optim::Adam*>(&opt) != nullptr) {
    return Load<optim::AdamParamState, AdamFields<optim::AdamParamState>>(in,
                                                                          opt);
  }
  if (dynamic_cast<optim::SGD*>(&opt) != nullptr) {
    return Load<optim::SGDParamState, SgdFields>(in, opt);
  }
  return Unsupported();
}

}  // namespace starling
