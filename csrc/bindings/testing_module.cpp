// ssd._C.testing: the core's pieces bound one by one for the tests (kernels
// through the model's packed layouts, the fan-out planner, the n-gram
// fallback, the draft worker's ranked lists, keyed randomness, the checkpoint
// parsers for the fuzz tests). Not a product API.
#include <torch/extension.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "../kernels/cpu/gumbel.h"
#include "../kernels/cpu/linear.h"
#include "../kernels/cpu/quant.h"
#include "../kernels/cpu/ops.h"
#include "../kernels/cpu/sampling.h"
#include "../model/backend.h"
#include "../model/kv_cache.h"
#include "../model/json.h"
#include "../model/safetensors.h"
#include "../runtime/fallback.h"
#include "../runtime/fanout.h"
#include "../runtime/ngram.h"
#include "../runtime/path_decoder.h"

namespace py = pybind11;

namespace ssd {

namespace {

// The cache-miss fallback's choice of kind ("auto"), without a draft model:
// a fresh fan-out planner (no draft step timed yet) beside it.
struct FallbackChoice {
  EngineConfig config;
  runtime::FanoutPlanner planner;
  runtime::Fallback fallback;
  explicit FallbackChoice(int64_t k) : config(with_k(k)), planner(k, {}, 1, 1), fallback(config, planner, nullptr) {}
  static EngineConfig with_k(int64_t k) {
    EngineConfig c;
    c.k = k;
    c.fallback = "auto";
    return c;
  }
};

runtime::FallbackKind fallback_kind_named(const std::string& kind) {
  if (kind == "fast") return runtime::FallbackKind::kFast;
  if (kind == "neural") return runtime::FallbackKind::kNeural;
  throw std::invalid_argument("fallback kind: 'neural' or 'fast', got '" + kind + "'");
}

// The fan-out planner, the worker's ranked lists and the n-gram fallback.
void bind_runtime_pieces(py::module_& m) {
  m.def("geometric_fanout", &runtime::geometric_fanout, py::arg("k"), py::arg("budget"),
        py::arg("acceptance"), py::arg("miss_exponent"));
  m.def(
      "confidence_branches",
      [](const std::vector<double>& proposed, const std::vector<std::vector<float>>& candidates, int64_t budget,
         const std::function<double(double)>& acceptance) {
        if (proposed.size() != candidates.size() || proposed.empty())
          throw std::invalid_argument("confidence_branches: one proposed probability and one candidate list "
                                      "per fork point (K + 1 of each)");
        std::vector<runtime::ForkPoint> forks(proposed.size());
        for (size_t j = 0; j < forks.size(); ++j) forks[j] = {proposed[j], candidates[j]};
        return runtime::confidence_branches(forks, budget, acceptance);
      },
      py::arg("proposed"), py::arg("candidates"), py::arg("budget"), py::arg("acceptance"),
      "The budget's (fork point, candidate index) pairs most likely to be the outcome, best first.");
  py::class_<runtime::FanoutPlanner>(m, "FanoutPlanner", "The ssd draft worker's fan-out planner (runtime/fanout.h).")
      .def(py::init<int64_t, std::vector<int64_t>, int64_t, int64_t>(), py::arg("k"), py::arg("fixed"),
           py::arg("budget"), py::arg("max_budget"))
      .def("observe_tree_step", &runtime::FanoutPlanner::observe_tree_step, py::arg("rows"), py::arg("seconds"))
      .def("observe_round", &runtime::FanoutPlanner::observe_round, py::arg("fork_seconds"),
           py::arg("tree_seconds"), py::arg("verify_seconds"), py::arg("sequences") = 1)
      .def("plan", &runtime::FanoutPlanner::plan, py::arg("num_seqs"))
      .def_property_readonly("budget", &runtime::FanoutPlanner::budget);
  m.def(
      "calibrated_acceptance",
      [](const std::vector<std::pair<double, bool>>& observed, const std::vector<double>& query) {
        runtime::FanoutPlanner planner(1, {}, 1, 1);
        for (const auto& [p, accepted] : observed) planner.observe_proposal(p, accepted);
        std::vector<double> out;
        for (double p : query) out.push_back(planner.proposal_acceptance(p));
        return out;
      },
      py::arg("observed"), py::arg("query"),
      "The confidence fan-out's acceptance estimates at `query` after (probability, accepted) observations.");
  m.def(
      "sum_exp",
      [](const at::Tensor& x, double shift) {
        TORCH_CHECK(x.dim() == 1 && x.scalar_type() == at::kFloat, "x must be a 1-D float32 tensor");
        const at::Tensor c = x.contiguous();
        return kernels::sum_exp(c.data_ptr<float>(), c.numel(), static_cast<float>(shift));
      },
      py::arg("x"), py::arg("shift"), "sum(exp(x - shift)), the draft's softmax normalizer.");
  m.def(
      "ranked_tokens",
      [](const at::Tensor& logits, int64_t depth, bool with_probs) {
        TORCH_CHECK(logits.dim() == 1 && logits.scalar_type() == at::kFloat, "logits must be a 1-D float32 tensor");
        TORCH_CHECK(depth >= 1, "depth must be >= 1");
        // The cpu backend's top_tokens over one row, read as the worker reads it.
        const auto backend = model::make_backend("cpu", "cpu", {});
        const auto [ids, probs] = backend->top_tokens(logits.contiguous().view({1, -1}), depth, with_probs);
        const runtime::RankedTokens r =
            runtime::RankedTokens::top(ids.data_ptr<int64_t>(), with_probs ? probs.data_ptr<float>() : nullptr, depth);
        return std::make_pair(r.tokens, r.probs);
      },
      py::arg("logits"), py::arg("depth"), py::arg("with_probs") = false,
      "The ssd draft worker's ranked list of a logits row: (tokens, probabilities at temperature 1).");
  py::class_<FallbackChoice>(m, "FallbackChoice", "The ssd cache-miss fallback's choice of kind (runtime/fallback.h).")
      .def(py::init<int64_t>(), py::arg("k"))
      .def("observe_verify", [](FallbackChoice& f, double seconds) { f.fallback.observe_verify(seconds); },
           py::arg("seconds"))
      .def("observe_emitted",
           [](FallbackChoice& f, const std::string& kind, int64_t accepted, bool tree_round) {
             f.fallback.observe_emitted(runtime::source_of(fallback_kind_named(kind)), accepted, tree_round);
           },
           py::arg("kind"), py::arg("accepted"), py::arg("tree_round") = true,
           "A verified round a kind ('neural' or 'fast') drafted kept `accepted` proposals.")
      .def("observe_run",
           [](FallbackChoice& f, const std::string& kind, double seconds, bool tree_round) {
             f.fallback.observe_run(fallback_kind_named(kind), seconds, tree_round);
           },
           py::arg("kind"), py::arg("seconds"), py::arg("tree_round") = true)
      .def("choose",
           [](FallbackChoice& f, int64_t batch) {
             return f.fallback.choose(batch) == runtime::FallbackKind::kFast ? "fast" : "neural";
           },
           py::arg("batch"));
  m.def("ngram_propose", &runtime::ngram_propose, py::arg("tokens"), py::arg("k"), py::arg("max_n") = 3);
  m.def("proposal_emitted", &runtime::proposal_emitted, py::arg("text"), py::arg("at"), py::arg("proposal"));
}

// Kernels through the model's packed layouts, and keyed randomness.
void bind_kernel_pieces(py::module_& m) {
  m.def("process_logits",
        [](const at::Tensor& logits, double temperature, int64_t top_k, double top_p) {
          at::Tensor x = logits.to(at::kFloat).contiguous();
          TORCH_CHECK(x.dim() == 1, "logits must be 1-D [vocab]");
          at::Tensor probs = at::empty_like(x);
          kernels::LogitsScratch scratch;
          kernels::process_logits(x.data_ptr<float>(), x.numel(), {temperature, top_k, top_p},
                                  probs.data_ptr<float>(), scratch);
          return probs;
        },
        py::arg("logits"), py::arg("temperature"), py::arg("top_k") = 0, py::arg("top_p") = 1.0,
        "logits: [vocab] -> processed probabilities [vocab] (temperature, top-k, top-p).");
  m.def(
      "silu_mul",
      [](const at::Tensor& gu) {
        TORCH_CHECK(gu.dim() == 2 && gu.size(1) % 2 == 0, "gu must be [rows, 2n]");
        const at::Tensor x = gu.to(at::kFloat).contiguous();
        const int64_t rows = x.size(0), n = x.size(1) / 2;
        at::Tensor out = at::empty({rows, n}, at::kFloat);
        kernels::silu_mul(x.data_ptr<float>(), out.data_ptr<float>(), rows, n);
        return out;
      },
      py::arg("gu"), "The model's MLP activation: silu(gu[:, :n]) * gu[:, n:].");
  m.def("packed_linear",
        [](const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias, bool pairs,
           int64_t threads) {
          TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1),
                      "x must be [m, k] and w [n, k] with the same k");
          TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf,
                      "w must be float32, bfloat16 or float16");
          // Rows may be strided (as the model's are): the kernels read k columns of each.
          const at::Tensor xs = x.scalar_type() == at::kFloat && x.stride(1) == 1 ? x : x.to(at::kFloat).contiguous();
          const int64_t m = x.size(0), n = w.size(0), k = w.size(1), ldx = xs.stride(0);
          at::Tensor b;
          if (bias.has_value()) {
            b = bias->to(at::kFloat).contiguous();
            TORCH_CHECK(b.dim() == 1 && b.size(0) == n, "bias must be [n]");
          }
          const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
          at::Tensor y = at::empty({m, n}, at::kFloat);
          kernels::ThreadPool pool(threads);
          const bool bf16 = w.scalar_type() == at::kBFloat16;
          const at::Tensor dense = w.contiguous();
          at::Tensor packed = at::empty({kernels::packed_size(n, k)}, w.scalar_type());
          std::vector<uint16_t> pair_w;
          if (pairs) pair_w.resize(static_cast<size_t>(kernels::pair_packed_size(n, k)));
          if (w.scalar_type() == at::kHalf) {
            TORCH_CHECK(!pairs, "the pair kernels take bf16 or fp32 weights, not fp16");
            auto* pw = reinterpret_cast<kernels::Fp16*>(packed.data_ptr<at::Half>());
            kernels::pack(reinterpret_cast<const kernels::Fp16*>(dense.data_ptr<at::Half>()), n, k, pw);
            kernels::linear(xs.data_ptr<float>(), ldx, pw, bp, y.data_ptr<float>(), n, m, n, k, pool);
          } else if (bf16) {
            auto* pw = reinterpret_cast<uint16_t*>(packed.data_ptr<at::BFloat16>());
            kernels::pack(reinterpret_cast<const uint16_t*>(dense.data_ptr<at::BFloat16>()), n, k, pw);
            if (pairs) kernels::pack_pairs(pw, n, k, pair_w.data());
            else kernels::linear(xs.data_ptr<float>(), ldx, pw, bp, y.data_ptr<float>(), n, m, n, k, pool);
          } else {
            kernels::pack(dense.data_ptr<float>(), n, k, packed.data_ptr<float>());
            if (pairs) kernels::pack_pairs(packed.data_ptr<float>(), n, k, pair_w.data());
            else kernels::linear(xs.data_ptr<float>(), ldx, packed.data_ptr<float>(), bp, y.data_ptr<float>(), n, m, n, k, pool);
          }
          if (pairs) kernels::linear_pairs(xs.data_ptr<float>(), ldx, pair_w.data(), bp, y.data_ptr<float>(), n, m, n, k, pool);
          return y;
        },
        py::arg("x"), py::arg("w"), py::arg("bias") = py::none(), py::arg("pairs") = false, py::arg("threads") = 1,
        "y = x @ w.T (+ bias) through the model's packed kernels: the exact layout (fp32 "
        "activations, batch invariant) or, with pairs=True, the draft's bf16 pair kernels.");
  m.def("quant_linear",
        [](const at::Tensor& x, const at::Tensor& blocks, const std::string& format, int64_t k,
           const c10::optional<at::Tensor>& bias, int64_t threads, bool int8_activations) {
          const kernels::QuantType type = kernels::quant_type(format);
          TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                          blocks.size(1) == kernels::gguf_row_bytes(type, k),
                      "blocks must be uint8 GGUF rows [n, row bytes of k weights]");
          TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "x must be [m, k]");
          const at::Tensor xs = x.scalar_type() == at::kFloat && x.stride(1) == 1 ? x : x.to(at::kFloat).contiguous();
          const at::Tensor rows = blocks.contiguous();
          const int64_t m = x.size(0), n = blocks.size(0);
          at::Tensor b;
          if (bias.has_value()) b = bias->to(at::kFloat).contiguous();
          // Packed in two parts (as a fused matrix is), the first not a whole number of tiles.
          at::Tensor packed = at::zeros({kernels::quant_packed_bytes(type, n, k)}, at::kByte);
          const int64_t first = n / 2;
          kernels::quant_pack(type, rows.data_ptr<uint8_t>(), first, k, 0, packed.data_ptr<uint8_t>());
          kernels::quant_pack(type, rows.data_ptr<uint8_t>() + first * rows.size(1), n - first, k, first,
                              packed.data_ptr<uint8_t>());
          at::Tensor y = at::empty({m, n}, at::kFloat);
          kernels::ThreadPool pool(threads);
          const auto product = int8_activations ? &kernels::linear_quant_i8 : &kernels::linear_quant;
          product(type, xs.data_ptr<float>(), xs.stride(0), packed.data_ptr<uint8_t>(),
                  b.defined() ? b.data_ptr<float>() : nullptr, y.data_ptr<float>(), n, m, n, k, pool);
          // Every row of the packed matrix, dequantised as the product sees it.
          at::Tensor dense = at::empty({n, k}, at::kFloat);
          for (int64_t r = 0; r < n; ++r)
            kernels::quant_row(type, packed.data_ptr<uint8_t>(), n, k, r, dense.data_ptr<float>() + r * k);
          return std::make_pair(y, dense);
        },
        py::arg("x"), py::arg("blocks"), py::arg("format"), py::arg("k"), py::arg("bias") = py::none(),
        py::arg("threads") = 1, py::arg("int8_activations") = false,
        "GGUF blocks [n, row bytes] of `format` (quant.h's: q8_0 .. q6_k) packed as the model packs them -> "
        "(y = x @ w.T (+ bias) [m, n] through the quantized kernel (fp32 activations, or int8 ones), the "
        "packed rows dequantised [n, k]).");
  m.def("quantize_rows",
        [](const at::Tensor& x) {
          TORCH_CHECK(x.dim() == 2 && x.size(1) % kernels::kQuantBlock == 0, "x must be [m, k], k a multiple of 32");
          const at::Tensor xs = x.to(at::kFloat).contiguous();
          const int64_t m = xs.size(0), k = xs.size(1);
          at::Tensor q = at::empty({m, k}, at::kChar);
          at::Tensor dx = at::empty({m, k / kernels::kQuantBlock}, at::kFloat), sx = at::empty_like(dx);
          kernels::ThreadPool pool(1);
          kernels::quantize_rows(xs.data_ptr<float>(), k, m, k, q.data_ptr<int8_t>(), dx.data_ptr<float>(),
                                 sx.data_ptr<float>(), pool);
          return std::make_tuple(q, dx, sx);
        },
        py::arg("x"), "Activation rows [m, k] quantized as the int8 product does -> (q int8 [m, k], dx, sx [m, k/32]).");
  m.def("quant_dequantize",
        [](const at::Tensor& blocks, const std::string& format, int64_t k) {
          const kernels::QuantType type = kernels::quant_type(format);
          TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 &&
                          blocks.size(1) == kernels::gguf_row_bytes(type, k),
                      "blocks must be uint8 GGUF rows [n, row bytes of k weights]");
          const at::Tensor rows = blocks.contiguous();
          at::Tensor dense = at::empty({blocks.size(0), k}, at::kFloat);
          kernels::quant_dequantize(type, rows.data_ptr<uint8_t>(), blocks.size(0), k, dense.data_ptr<float>());
          return dense;
        },
        py::arg("blocks"), py::arg("format"), py::arg("k"),
        "GGUF blocks [n, row bytes] -> fp32 [n, k], the C++ dequantisation (the fallback of mixed matrices).");
  m.def("thread_pool_visits",
        [](int64_t n, int64_t grain, int64_t threads, int64_t jobs) {
          kernels::ThreadPool pool(threads);
          std::vector<std::atomic<int64_t>> visits(static_cast<size_t>(n));
          std::atomic<bool> aligned{true};
          for (int64_t j = 0; j < jobs; ++j)
            pool.parallel_for(n, grain, [&](int64_t begin, int64_t end) {
              if (begin % grain != 0 || begin >= end) aligned = false;
              for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1, std::memory_order_relaxed);
            });
          std::vector<int64_t> counts(visits.begin(), visits.end());
          return std::make_pair(counts, aligned.load());
        },
        py::arg("n"), py::arg("grain"), py::arg("threads"), py::arg("jobs"),
        "Runs `jobs` parallel_for calls over [0, n) on one ThreadPool; returns (how often each index was "
        "visited, whether every chunk was non-empty and began on a multiple of grain).");
  m.def("thread_pool_sharing",
        [](int64_t threads, int64_t jobs, int64_t work, std::optional<std::vector<int64_t>> others) {
          // others: a scripted load probe, one reading per call (the last repeats); none: /proc/loadavg.
          kernels::ThreadPool::LoadProbe probe;
          size_t next = 0;
          if (others && !others->empty())
            probe = [&others, &next](int64_t) { return (*others)[std::min(next++, others->size() - 1)]; };
          kernels::ThreadPool pool(threads, probe);
          std::vector<double> sums(64, 0.0);
          std::vector<int64_t> shared(static_cast<size_t>(jobs));
          for (int64_t j = 0; j < jobs; ++j) {
            shared[j] = pool.sharing() ? 1 : 0;
            pool.parallel_for(64, 1, [&](int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i)
                for (int64_t r = 0; r < work; ++r) sums[i] += 1e-9 * static_cast<double>(r ^ i);
            });
          }
          return shared;
        },
        py::arg("threads"), py::arg("jobs"), py::arg("work"), py::arg("others") = py::none(),
        "Runs `jobs` parallel_for calls of 64 indices x `work` additions on one ThreadPool; returns, per "
        "job, 1 when the pool shared it with its workers and 0 when the caller ran it alone. others: "
        "scripted readings of the others' runnable threads (one per look, the last repeats); none: the "
        "machine's run queue.");
  m.def("loadavg_runnable", &kernels::loadavg_runnable, py::arg("text"),
        "The runnable-thread count in /proc/loadavg's text (its fourth field, before the '/'); -1 when "
        "the text has no such field.");
  m.def("pairs_native", &kernels::pairs_native, "Whether the bf16 pair kernels use AVX512-BF16 instructions.");
  m.def("keyed_uniform", [](uint64_t seed, uint64_t position, uint64_t purpose) {
    return kernels::keyed_uniform(seed, position, static_cast<kernels::RandomPurpose>(purpose));
  });
  m.def(
      "gumbel_top",
      [](const at::Tensor& probs, uint64_t seed, uint64_t position, int64_t depth) {
        const at::Tensor p = probs.to(at::kFloat).contiguous();
        TORCH_CHECK(p.dim() == 1, "probs must be 1-D [vocab]");
        TORCH_CHECK(depth >= 0, "depth must be >= 0");
        std::vector<int32_t> ids(static_cast<size_t>(depth));
        std::vector<double> scores(static_cast<size_t>(depth));
        const int64_t n = kernels::gumbel_top(p.data_ptr<float>(), p.numel(), kernels::gumbel_row_key(seed, position),
                                              depth, ids.data(), scores.data());
        ids.resize(static_cast<size_t>(n));
        scores.resize(static_cast<size_t>(n));
        return std::make_pair(ids, scores);
      },
      py::arg("probs"), py::arg("seed"), py::arg("position"), py::arg("depth"),
      "The `depth` best tokens of probs' support by probs_t / E_t at (seed, position): (ids, scores).");
}

// A parsed JSON value as the Python object json.loads gives for the same text.
py::object to_python(const model::json::Value& v) {
  if (v.is_null()) return py::none();
  if (v.is_bool()) return py::bool_(v.as_bool());
  if (v.is_int()) return py::int_(v.as_int());
  if (v.is_number()) return py::float_(v.as_double());
  if (v.is_string()) return py::str(v.as_string());
  if (v.is_array()) {
    py::list out;
    for (const auto& item : v.as_array()) out.append(to_python(item));
    return out;
  }
  py::dict out;
  for (const auto& [key, member] : v.as_object()) out[py::str(key)] = to_python(member);
  return out;
}

// The checkpoint parsers on bytes, for the fuzz tests (tests/fuzz/). Both
// raise ValueError (std::invalid_argument) for malformed input, nothing else.
void bind_parsers(py::module_& m) {
  m.def(
      "parse_json",
      [](const py::bytes& text) { return to_python(model::json::parse(std::string_view(text))); },
      py::arg("text"), "The C++ JSON reader (model/json.h) on `text`: the value as json.loads builds it.");
  m.def(
      "parse_safetensors",
      [](const py::bytes& data, const std::string& path) {
        const std::string_view bytes(data);
        const uint64_t n = model::safetensors::header_length(bytes.substr(0, 8), bytes.size(), path);
        const auto file = model::safetensors::parse_header(bytes.substr(8, n), bytes.size(), path);
        py::dict tensors;
        for (const auto& [name, info] : file.tensors)
          tensors[py::str(name)] = py::make_tuple(info.dtype->name, info.dtype->itemsize, info.shape, info.begin,
                                                  info.end);
        return py::make_tuple(file.data_start, tensors);
      },
      py::arg("data"), py::arg("path") = "fuzz.safetensors",
      "The header checks of a safetensors file whose whole contents are `data`: (data_start, {name: (dtype, "
      "itemsize, shape, begin, end)}), offsets relative to data_start.");
}

// One model backend's steps, one by one, so that every backend can be tested
// against the cpu backend (the oracle) on the same inputs. Tensors go in and
// come out on the backend's device.
class BackendSteps {
 public:
  BackendSteps(const std::string& device, const std::string& backend, bool batch_invariant)
      : backend_(model::make_backend(device, backend, model::BackendOptions{batch_invariant})), pool_(1) {}

  std::string name() const { return backend_->name(); }

  // fn() called while this thread holds the backend's thread_scope of `role`.
  py::object in_thread_scope(const std::string& role, const py::function& fn) {
    if (role != "target" && role != "draft")
      throw std::invalid_argument("role must be 'target' or 'draft', got '" + role + "'");
    const std::shared_ptr<void> scope =
        backend_->thread_scope(role == "target" ? model::StreamRole::target : model::StreamRole::draft);
    return fn();
  }

  at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                    bool bf16, int64_t matmul_min_rows) {
    check_rows(x, weight.size(1), "linear: x");
    const model::Matrix w = backend_->matrix(weight, bf16 ? at::kBFloat16 : at::kFloat);
    const at::Tensor b = bias ? backend_->vector(*bias) : at::Tensor();
    const at::Tensor in = on_device(x);
    return step([&](model::StepContext& ctx) { return backend_->linear(in, w, b, ctx); }, matmul_min_rows);
  }

  at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
    if (x.dim() != 2 && x.dim() != 3) throw std::invalid_argument("rms_norm: x must be [rows, n] or [T, heads, n]");
    const at::Tensor in = on_device(x), weight = backend_->vector(w);
    const at::Tensor out = at::empty_like(in);
    return step([&](model::StepContext& ctx) {
      backend_->rms_norm(in, weight, static_cast<float>(eps), out, ctx);
      return out;
    });
  }

  /// One layer's attention on a fresh cache of num_blocks x block_size slots:
  /// rope on q and k (views of the fused rows qkv [T, (Hq + 2 Hkv) d]), k and v
  /// written to their slots, then causal paged attention (over the last
  /// `window` keys when window > 0), or fork attention where prefix_seq and
  /// prefix_len are given ([T] each; ForwardInput's). Returns (out
  /// [T, Hq d], the rotated qkv, the cache [2, num_blocks, block_size, Hkv, d]).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> attention(const at::Tensor& qkv, int64_t num_heads,
                                                           int64_t num_kv_heads, const at::Tensor& inv_freq,
                                                           const std::vector<int32_t>& positions,
                                                           const std::vector<int32_t>& seq_of_token,
                                                           const std::vector<std::vector<int32_t>>& tables,
                                                           int64_t num_blocks, int64_t block_size,
                                                           int64_t window, const std::string& kv_dtype,
                                                           const std::vector<int32_t>& prefix_seq,
                                                           const std::vector<int32_t>& prefix_len) {
    const int64_t d = inv_freq.numel() * 2;
    if (qkv.dim() != 2 || qkv.size(1) != (num_heads + 2 * num_kv_heads) * d || num_heads % num_kv_heads != 0)
      throw std::invalid_argument("attention: qkv must be [T, (num_heads + 2 num_kv_heads) head_dim]");
    ModelConfig config;
    config.num_layers = 1;
    config.num_kv_heads = num_kv_heads;
    config.head_dim = d;
    model::KvCache cache(config, num_blocks, block_size, *backend_, kv_dtype);
    model::ForwardInput in;
    in.positions = positions;
    in.seq_of_token = seq_of_token;
    in.tokens.assign(positions.size(), 0);
    in.prefix_seq = prefix_seq;
    in.prefix_len = prefix_len;
    for (const auto& row : tables) in.max_blocks = std::max<int64_t>(in.max_blocks, static_cast<int64_t>(row.size()));
    in.block_tables.assign(tables.size() * static_cast<size_t>(in.max_blocks), -1);  // -1: no block
    for (size_t s = 0; s < tables.size(); ++s)
      std::copy(tables[s].begin(), tables[s].end(), in.block_tables.begin() + static_cast<int64_t>(s) * in.max_blocks);
    const int64_t t = qkv.size(0);
    if (static_cast<int64_t>(positions.size()) != t || static_cast<int64_t>(seq_of_token.size()) != t)
      throw std::invalid_argument("attention: one position and one sequence index per row of qkv");
    if (in.prefix_seq.size() != in.prefix_len.size() || (in.forks() && static_cast<int64_t>(in.prefix_seq.size()) != t))
      throw std::invalid_argument("attention: prefix_seq and prefix_len must both be empty or have one entry per row");
    const at::Tensor rows = on_device(qkv).clone(), freq = backend_->vector(inv_freq);
    const at::Tensor out = step([&](model::StepContext& ctx) {
      const model::DeviceBatch b = backend_->upload(in);
      const at::Tensor q = rows.narrow(1, 0, num_heads * d).view({t, num_heads, d});
      const at::Tensor k = rows.narrow(1, num_heads * d, num_kv_heads * d).view({t, num_kv_heads, d});
      const at::Tensor v = rows.narrow(1, (num_heads + num_kv_heads) * d, num_kv_heads * d).view({t, num_kv_heads, d});
      backend_->rope_kv_write(q, k, v, freq, cache, 0, b, ctx);
      const float scale = 1.0f / std::sqrt(static_cast<float>(d));
      return in.forks() ? backend_->fork_attention(q, cache, 0, b, scale, window, ctx)
                        : backend_->paged_attention(q, cache, 0, b, scale, window, ctx);
    });
    return {out, rows, cache.storage()[0]};
  }

  at::Tensor silu_mul(const at::Tensor& gu) {
    const at::Tensor in = on_device(gu);
    return step([&](model::StepContext&) { return backend_->silu_mul(in); });
  }

  /// copy_kv_slots on a fresh cache holding `kv` [layers, 2, num_blocks,
  /// block_size, kv_heads, head_dim]: returns the cache's storage after the copy.
  at::Tensor copy_kv_slots(const at::Tensor& kv, const std::vector<int64_t>& src_slots,
                           const std::vector<int64_t>& dst_slots) {
    if (kv.dim() != 6 || kv.size(1) != 2)
      throw std::invalid_argument("copy_kv_slots: kv must be [layers, 2, num_blocks, block_size, kv_heads, head_dim]");
    ModelConfig config;
    config.num_layers = kv.size(0);
    config.num_kv_heads = kv.size(4);
    config.head_dim = kv.size(5);
    model::KvCache cache(config, kv.size(2), kv.size(3), *backend_);
    cache.storage().copy_(kv);
    return step([&](model::StepContext&) {
      backend_->copy_kv_slots(cache, src_slots, dst_slots);
      return cache.storage();
    });
  }

 private:
  // One step as a forward runs it (on the backend's stream), finished before
  // its result is handed back.
  template <typename F>
  at::Tensor step(F&& run, int64_t matmul_min_rows = 0) {
    model::StepContext ctx{pool_, matmul_min_rows};
    at::Tensor out;
    {
      const auto scope = backend_->forward_scope();
      out = run(ctx);
      backend_->synchronize();
    }
    return out;
  }

  at::Tensor on_device(const at::Tensor& t) const {
    return t.to(backend_->device(), at::kFloat).contiguous();
  }
  static void check_rows(const at::Tensor& x, int64_t k, const char* what) {
    if (x.dim() != 2 || x.size(1) != k)
      throw std::invalid_argument(std::string(what) + " must be [m, " + std::to_string(k) + "]");
  }

  std::unique_ptr<model::Backend> backend_;
  kernels::ThreadPool pool_;
};

void bind_backend_steps(py::module_& m) {
  py::class_<BackendSteps>(m, "BackendSteps")
      .def(py::init<const std::string&, const std::string&, bool>(), py::arg("device") = "cpu",
           py::arg("backend") = "auto", py::arg("batch_invariant") = true)
      .def_property_readonly("name", &BackendSteps::name)
      .def("in_thread_scope", &BackendSteps::in_thread_scope, py::arg("role"), py::arg("fn"),
           "fn() called while this thread drives the backend in `role` ('target' or 'draft'; "
           "Backend::thread_scope): on the cuda backend that role's stream is the current one.")
      .def("linear", &BackendSteps::linear, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
           py::arg("bf16") = false, py::arg("matmul_min_rows") = 0,
           "y [m, n] = x [m, k] @ weight [n, k]^T + bias, the weight stored in bf16 or fp32.")
      .def("rms_norm", &BackendSteps::rms_norm, py::arg("x"), py::arg("weight"), py::arg("eps"))
      .def("silu_mul", &BackendSteps::silu_mul, py::arg("gu"))
      .def("copy_kv_slots", &BackendSteps::copy_kv_slots, py::arg("kv"), py::arg("src_slots"),
           py::arg("dst_slots"),
           "The K and V rows of slots src_slots copied to dst_slots (slot = block * block_size + offset) in a "
           "cache holding kv [layers, 2, num_blocks, block_size, kv_heads, head_dim]: the storage after the copy.")
      .def("attention", &BackendSteps::attention, py::arg("qkv"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("inv_freq"), py::arg("positions"), py::arg("seq_of_token"), py::arg("block_tables"),
           py::arg("num_blocks"), py::arg("block_size"), py::arg("window") = 0, py::arg("kv_dtype") = "float32",
           py::arg("prefix_seq") = std::vector<int32_t>{}, py::arg("prefix_len") = std::vector<int32_t>{},
           "rope_kv_write then paged_attention (fork_attention with prefix_seq and prefix_len) on a fresh "
           "one-layer cache: (out, rotated qkv, cache).");
}

}  // namespace

void bind_testing_policy(py::module_& m);   // testing_policy.cpp
void bind_testing_forward(py::module_& m);  // testing_forward.cpp

void bind_testing(py::module_ m) {
  bind_testing_policy(m);
  bind_testing_forward(m);
  bind_backend_steps(m);
  bind_runtime_pieces(m);
  bind_kernel_pieces(m);
  bind_parsers(m);
}

}  // namespace ssd
