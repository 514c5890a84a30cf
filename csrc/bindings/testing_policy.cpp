// ssd._C.testing.PolicyHarness: the adaptive policy (runtime/adaptive_policy.h)
// driven by hand, without models: a test plays the engine's part (plans,
// forwards, round outcomes, step times) with whatever timings and outcomes
// it needs, and reads the policy's lookaheads, counters and gauges. Not a
// product API.
#include <torch/extension.h>

#include <pybind11/stl.h>

#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "../runtime/adaptive_policy.h"

namespace py = pybind11;

namespace ssd {

namespace {

runtime::CacheLookup lookup_named(const std::string& name) {
  if (name == "none") return runtime::CacheLookup::kNone;
  if (name == "hit") return runtime::CacheLookup::kHit;
  if (name == "neural") return runtime::CacheLookup::kNeuralFallback;
  if (name == "fast") return runtime::CacheLookup::kFastFallback;
  throw std::invalid_argument("lookup: one of none, hit, neural, fast; got '" + name + "'");
}

EngineConfig policy_config(const std::string& mode, int64_t k, const std::string& fallback) {
  if (mode != "sd" && mode != "ssd") throw std::invalid_argument("mode: 'sd' or 'ssd', got '" + mode + "'");
  if (fallback != "auto" && fallback != "neural" && fallback != "fast")
    throw std::invalid_argument("fallback: 'auto', 'neural' or 'fast', got '" + fallback + "'");
  EngineConfig c;
  c.mode = mode;
  c.k = k;
  c.fallback = fallback;
  c.adaptive = true;
  return c;
}

class PolicyHarness {
 public:
  PolicyHarness(const std::string& mode, int64_t k, int64_t batch, const std::string& fallback)
      : config_(policy_config(mode, k, fallback)), policy_(config_, testing_) {
    if (batch < 1) throw std::invalid_argument("batch must be >= 1, got " + std::to_string(batch));
    finished_.assign(static_cast<size_t>(batch), false);
    for (int64_t i = 0; i < batch; ++i) {
      seqs_.emplace_back();
      seqs_.back().id = static_cast<RequestId>(i);
    }
  }

  void start(int64_t i) { policy_.first_round(&seq(i)); }
  /// Sequence i finished: later steps' batches leave it out.
  void finish(int64_t i) {
    seq(i);  // checks i
    finished_[static_cast<size_t>(i)] = true;
  }
  void plan(const py::dict& draft_totals, int64_t context) {
    if (context < 0) throw std::invalid_argument("context must be >= 0, got " + std::to_string(context));
    if (context > 0)
      for (auto& s : seqs_) s.num_computed = context;
    DraftCounters totals;
    DraftCounters::fields([&](const char* name, auto member) {
      using Field = std::remove_reference_t<decltype(totals.*member)>;
      if (draft_totals.contains(name)) totals.*member = draft_totals[name].cast<Field>();
    });
    std::vector<runtime::Sequence*> decoding;
    for (size_t i = 0; i < seqs_.size(); ++i)
      if (!finished_[i]) decoding.push_back(&seqs_[i]);
    policy_.plan(decoding, totals);
  }
  void observe_forward(int64_t rows, double seconds, double draft_busy) {
    policy_.observe_forward(rows, seconds, draft_busy);
  }
  void observe_step(double seconds, bool decode_only) { policy_.observe_step(seconds, decode_only); }
  void after_round(int64_t i, int64_t proposed, int64_t accepted, const std::string& lookup) {
    policy_.after_round(&seq(i), proposed, accepted, lookup_named(lookup));
  }
  std::vector<int64_t> lookaheads() const {
    std::vector<int64_t> v;
    for (const auto& s : seqs_) v.push_back(s.lookahead);
    return v;
  }
  std::vector<bool> trees() const {
    std::vector<bool> v;
    for (const auto& s : seqs_) v.push_back(s.trees);
    return v;
  }
  py::dict stats() const {
    EngineStats s;
    policy_.stats(s);
    py::dict d;
    AdaptiveCounters::fields([&](const char* name, auto member) { d[name] = s.adaptive.*member; });
    PolicyGauges::fields([&](const char* name, auto member) { d[name] = s.policy.*member; });
    return d;
  }

 private:
  runtime::Sequence& seq(int64_t i) {
    if (i < 0 || i >= static_cast<int64_t>(seqs_.size()))
      throw std::out_of_range("sequence " + std::to_string(i) + " of " + std::to_string(seqs_.size()));
    return seqs_[static_cast<size_t>(i)];
  }

  EngineConfig config_;
  TestingConfig testing_;
  runtime::AdaptivePolicy policy_;
  std::deque<runtime::Sequence> seqs_;  // stable addresses
  std::vector<bool> finished_;          // by sequence: left out of the steps' batches
};

}  // namespace

void bind_testing_policy(py::module_& m) {
  py::class_<PolicyHarness>(m, "PolicyHarness",
                            "The adaptive policy driven by hand: the test plays the engine (see testing_policy.cpp).")
      .def(py::init<const std::string&, int64_t, int64_t, const std::string&>(), py::arg("mode"), py::arg("k"),
           py::arg("batch"), py::arg("fallback") = "auto")
      .def("start", &PolicyHarness::start, py::arg("i"), "Sequence i's prefill is done: its first round is set.")
      .def("finish", &PolicyHarness::finish, py::arg("i"), "Sequence i finished: later batches leave it out.")
      .def("plan", &PolicyHarness::plan, py::arg("draft_totals") = py::dict(), py::arg("context") = 0,
           "A step begins: plans the rounds its outcomes open. draft_totals: DraftCounters fields so far; "
           "context: when > 0, every sequence's KV length (num_computed) from now on.")
      .def("observe_forward", &PolicyHarness::observe_forward, py::arg("rows"), py::arg("seconds"),
           py::arg("draft_busy") = 0.0)
      .def("observe_step", &PolicyHarness::observe_step, py::arg("seconds"), py::arg("decode_only") = true)
      .def("after_round", &PolicyHarness::after_round, py::arg("i"), py::arg("proposed"), py::arg("accepted"),
           py::arg("lookup") = "none", "Sequence i's round kept `accepted` of `proposed`; sets its next round.")
      .def("lookaheads", &PolicyHarness::lookaheads)
      .def("trees", &PolicyHarness::trees)
      .def("stats", &PolicyHarness::stats, "The policy's adaptive_* counters and policy_* gauges.");
}

}  // namespace ssd
