// The `starling._starling` extension: the C++ half of `import starling`
// (python/starling/__init__.py holds the API a PyTorch user calls).
//  - _check_flags / _Diloco take the node's flags as command-line
//    arguments ("--name=value") and parse them with `starling node`'s own
//    parser (node/flags.h, node/node_flags.h), so every check and message
//    is the CLI's; InvalidArgument becomes ValueError.
//  - _Diloco runs the node's DiLoCo round over the caller's tensors
//    (node/embedded_diloco.h). The tensors cross through torch's pybind
//    casters: the C++ side holds the very tensors of the model, no copy.
//    Joining, each round, checkpoints and leaving release the GIL.
//  - _Gossip runs the node's push-sum gossip period over the caller's
//    parameters (node/embedded_gossip.h), the same way.
// Other failures raise starling.SwarmError (a RuntimeError): a refused
// handshake, nobody answering, a round that failed here.
// Thread-safety: the flags are process-wide, so _check_flags and the
// _Diloco / _Gossip constructors parse under the GIL, one at a time; one
// member per process at once is what a node is (a second one listens
// elsewhere).
#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/flat_params.h"
#include "core/model.h"
#include "gossip/membership.h"
#include "node/embedded_diloco.h"
#include "node/embedded_gossip.h"
#include "node/flags.h"
#include "node/node_command.h"
#include "node/node_flags.h"
#include "node/node_ops.h"
#include "node/node_run.h"

namespace py = pybind11;

namespace starling {
namespace {

PyObject* swarm_error = nullptr;

[[noreturn]] void Raise(const absl::Status& s) {
  if (absl::IsInvalidArgument(s))
    throw py::value_error(std::string(s.message()));
  PyErr_SetString(swarm_error, std::string(s.message()).c_str());
  throw py::error_already_set();
}

// The flags as the node's parser leaves them: every call starts from the
// flags' defaults, as a fresh `starling node` process does.
absl::StatusOr<NodeConfig> ParseNodeArgs(const std::vector<std::string>& args) {
  for (const std::string& name : NodeSubcommand().flags) {
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string error;
    if (flag != nullptr && !flag->ParseFrom(flag->DefaultValue(), &error)) {
      return absl::InternalError(
          absl::StrCat("the default of --", name, ": ", error));
    }
  }
  HelpRequest help = HelpRequest::kNone;
  absl::Status s = ParseSubcommandFlags(NodeSubcommand(), args, &help);
  if (!s.ok()) return s;
  if (help != HelpRequest::kNone) {
    return absl::InvalidArgumentError(
        "--help: see `starling node --help` for the flags");
  }
  return NodeConfigFromFlags();
}

// Calls `f` (returning a StatusOr) without the GIL; raises as Raise does.
template <typename F>
auto WithoutGil(F f) -> typename decltype(f())::value_type {
  decltype(f()) r;
  {
    py::gil_scoped_release release;
    r = f();
  }
  if (!r.ok()) Raise(r.status());
  return *std::move(r);
}

// Parses `args`, starts the node's health and metrics servers and then the
// driver (EmbeddedDiloco or EmbeddedGossip) without the GIL; raises as
// Raise does.
template <typename Driver>
std::unique_ptr<Driver> StartDriver(const std::vector<std::string>& args,
                                    EmbeddedModel model) {
  absl::StatusOr<NodeConfig> config = ParseNodeArgs(args);
  if (!config.ok()) Raise(config.status());
  // What reads the process-wide flags, under the GIL (see above).
  ApplyResumeIfExists(&config->train);
  NodeOps ops;
  if (absl::Status s = StartOps(config->net.node_id, config->algo, "cpu", &ops);
      !s.ok()) {
    Raise(s);
  }
  return WithoutGil([&] {
    return Driver::Start(*std::move(config), std::move(model), std::move(ops));
  });
}

// What _Diloco and _Gossip share: the driver, started from the flags and
// the model's tensors, the inner steps' metrics, and leaving.
template <typename Driver>
class PyMember {
 public:
  PyMember(const std::vector<std::string>& args,
           std::vector<std::string> param_names,
           std::vector<torch::Tensor> params,
           std::vector<std::string> buffer_names,
           std::vector<torch::Tensor> buffers, std::string architecture)
      : d_(StartDriver<Driver>(
            args,
            {std::move(param_names), std::move(params), std::move(buffer_names),
             std::move(buffers), std::move(architecture)})) {}

  void InnerStep(double seconds, int64_t tokens, double loss, double lr) {
    StepResult r;
    r.seconds = seconds;
    r.tokens = tokens;
    r.loss = loss;
    r.lr = lr;
    Live().InnerStep(r);
  }

  void Leave() {
    if (d_ == nullptr) return;
    py::gil_scoped_release release;
    d_->Leave();
  }

  Driver& Live() {
    if (d_ == nullptr) Raise(absl::FailedPreconditionError("not started"));
    return *d_;
  }

  void Checkpoint(const std::string& user_state) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = Live().Checkpoint(user_state);
    }
    if (!s.ok()) Raise(s);
  }

 protected:
  std::unique_ptr<Driver> d_;
};

class PyDiloco : public PyMember<EmbeddedDiloco> {
 public:
  using PyMember::PyMember;

  py::dict Round(int steps, int64_t samples) {
    const EmbeddedRound r =
        WithoutGil([&] { return Live().Round(steps, samples); });
    py::dict out;
    out["outcome"] = r.outcome;
    out["round"] = r.round;
    out["members"] = r.members;
    out["model_hash"] = r.model_hash;
    out["seconds"] = r.seconds;
    out["wire_bytes"] = r.wire_bytes;
    out["checkpoint_due"] = r.checkpoint_due;
    return out;
  }

  void Abandon() {
    if (d_ != nullptr) d_->Abandon();
  }
};

class PyGossip : public PyMember<EmbeddedGossip> {
 public:
  using PyMember::PyMember;

  py::dict Period(int steps, double train_loss) {
    const EmbeddedPeriod r =
        WithoutGil([&] { return Live().Period(steps, train_loss); });
    py::dict out;
    out["period"] = r.period;
    out["peer"] = r.peer;
    out["absorbed"] = r.absorbed;
    out["weight"] = r.weight;
    out["members"] = r.members;
    out["model_hash"] = r.model_hash;
    out["seconds"] = r.seconds;
    out["wire_bytes"] = r.wire_bytes;
    out["checkpoint_due"] = r.checkpoint_due;
    return out;
  }

  py::dict Counters() {
    const GossipCounters& c = Live().counters();
    py::dict out;
    out["exchanges"] = c.exchanges;
    out["pushes"] = c.pushes;
    out["absorbs"] = c.absorbs;
    out["failed_pushes"] = c.failed_pushes;
    out["raw_bytes"] = c.raw_bytes;
    out["wire_bytes"] = c.wire_bytes;
    out["max_world"] = c.max_world;
    return out;
  }
};

py::list MemberList(const std::vector<peer::v1::MemberEntry>& members) {
  py::list out;
  for (const auto& e : members) {
    py::dict m;
    m["id"] = e.id();
    m["address"] = e.address();
    m["state"] = MemberStateName(e.state());
    m["round"] = e.round();
    out.append(m);
  }
  return out;
}

// The methods and properties both classes have.
template <typename T>
void DefMember(py::class_<T>& c) {
  c.def(py::init<const std::vector<std::string>&, std::vector<std::string>,
                 std::vector<torch::Tensor>, std::vector<std::string>,
                 std::vector<torch::Tensor>, std::string>())
      .def("leave", [](T& m) { m.Leave(); })
      .def(
          "inner_step",
          [](T& m, double seconds, int64_t tokens, double loss, double lr) {
            m.InnerStep(seconds, tokens, loss, lr);
          },
          "One inner step (seconds, tokens, loss, lr) for the watchdog "
          "and the metrics.")
      .def_property_readonly("health_address",
                             [](T& m) { return m.Live().health_address(); })
      .def_property_readonly("metrics_address",
                             [](T& m) { return m.Live().metrics_address(); })
      .def(
          "members", [](T& m) { return MemberList(m.Live().Members()); },
          "The swarm's members as this one sees them.")
      .def_property_readonly("address", [](T& m) { return m.Live().address(); })
      .def_property_readonly("step", [](T& m) { return m.Live().step(); })
      .def_property_readonly("model_hash",
                             [](T& m) { return m.Live().model_hash(); })
      .def_property_readonly("architecture",
                             [](T& m) { return m.Live().architecture(); })
      .def_property_readonly("n_params",
                             [](T& m) { return m.Live().n_params(); })
      .def("checkpoint", &T::Checkpoint,
           "Writes OUT/checkpoint.ckpt with these bytes as its user_state.")
      .def_property_readonly("checkpoints",
                             [](T& m) { return m.Live().checkpoints(); })
      .def_property_readonly("resumed", [](T& m) { return m.Live().resumed(); })
      .def_property_readonly("resumed_user_state", [](T& m) {
        return py::bytes(m.Live().resumed_user_state());
      });
}

}  // namespace
}  // namespace starling

PYBIND11_MODULE(_starling, m) {
  using starling::PyDiloco;
  using starling::PyGossip;
  m.doc() = "Starling's C++ core (see the starling package)";
  starling::swarm_error = PyErr_NewExceptionWithDoc(
      "starling.SwarmError",
      "The swarm failed: a refused handshake (naming what differs), no "
      "member answering, a round that failed on this node.",
      PyExc_RuntimeError, nullptr);
  m.attr("SwarmError") = py::handle(starling::swarm_error);
  m.attr("TORCH_VERSION") = py::str(TORCH_VERSION);
  m.def(
      "_node_flag_names",
      [] {
        // The node's own, and the run directory's among the trainer's:
        // the others (model, data, steps, schedule) are the Python loop's.
        std::vector<std::string> names = starling::NodeFlagNames();
        for (const char* name : {"out", "checkpoint_every", "resume"}) {
          names.push_back(name);
        }
        return names;
      },
      "The flags of `starling node` that the Python API takes.");
  m.def(
      "_check_flags",
      [](const std::vector<std::string>& args) {
        absl::StatusOr<starling::NodeConfig> c = starling::ParseNodeArgs(args);
        if (!c.ok()) starling::Raise(c.status());
      },
      "Parses node flags ('--name=value') as `starling node` does; "
      "ValueError with its message.");
  m.def(
      "_architecture",
      [](std::vector<std::string> param_names,
         std::vector<torch::Tensor> params,
         std::vector<std::string> buffer_names,
         std::vector<torch::Tensor> buffers) {
        return starling::EmbeddedArchitecture(
            {std::move(param_names), std::move(params), std::move(buffer_names),
             std::move(buffers), ""});
      },
      "The handshake's name for an eager model: python(DIGEST).");
  m.def(
      "_model_hash",
      [](const std::vector<torch::Tensor>& params,
         const std::vector<torch::Tensor>& buffers) {
        return starling::ModelHash(params, buffers);
      },
      "ModelHash of the tensors (core/flat_params.h), as the node logs it.");
  m.def(
      "torchscript_architecture",
      [](const std::string& path) {
        starling::ModelOptions options;
        options.spec = absl::StrCat("torchscript:", path);
        absl::StatusOr<std::unique_ptr<starling::Model>> model;
        {
          py::gil_scoped_release release;
          model = starling::CreateModel(options);
        }
        if (!model.ok()) starling::Raise(model.status());
        return (*model)->Architecture();
      },
      "The handshake's name for the TorchScript file at `path`, as "
      "`starling node --model=torchscript:PATH` gives it: pass it as "
      "DiLoCo's architecture= for torch.jit.load(path), so that Python and "
      "C++ members of that model share a swarm.");
  py::class_<PyDiloco> diloco(m, "_Diloco");
  starling::DefMember(diloco);
  diloco.def("round", &PyDiloco::Round)
      .def("abandon", &PyDiloco::Abandon)
      .def_property_readonly("round_number",
                             [](PyDiloco& d) { return d.Live().round(); });
  py::class_<PyGossip> gossip(m, "_Gossip");
  starling::DefMember(gossip);
  gossip
      .def("period", &PyGossip::Period,
           "One gossip period after (steps, mean train loss or NaN).")
      .def_property_readonly("periods",
                             [](PyGossip& g) { return g.Live().periods(); })
      .def_property_readonly("weight",
                             [](PyGossip& g) { return g.Live().weight(); })
      .def_property_readonly("counters", &PyGossip::Counters);
}
