// The pybind11 module ssd._C: a thin layer over the C++ core. Configs cross
// as dicts (the Python dataclasses mirror the C++ structs field by field);
// std::invalid_argument surfaces as ValueError.
#include <torch/extension.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include "../kernels/cpu/linear.h"
#include "../kernels/cpu/ops.h"
#include "../kernels/cpu/sampling.h"
#include "../model/model.h"
#include "../model/runner.h"
#include "../runtime/fanout.h"
#include "../runtime/ngram.h"
#include "ssd/engine.h"

namespace py = pybind11;

namespace ssd {
namespace {

template <typename T>
void get(const py::dict& d, const char* key, T& out) {
  if (d.contains(key) && !d[key].is_none()) out = d[key].cast<T>();
}

ModelConfig model_config_from(const py::dict& d) {
  ModelConfig c;
  c.architecture = parse_architecture(d["architecture"].cast<std::string>());
  get(d, "vocab_size", c.vocab_size);
  get(d, "hidden_size", c.hidden_size);
  get(d, "intermediate_size", c.intermediate_size);
  get(d, "num_layers", c.num_layers);
  get(d, "num_heads", c.num_heads);
  get(d, "num_kv_heads", c.num_kv_heads);
  get(d, "head_dim", c.head_dim);
  get(d, "rms_norm_eps", c.rms_norm_eps);
  get(d, "rope_theta", c.rope_theta);
  get(d, "tie_word_embeddings", c.tie_word_embeddings);
  get(d, "max_position_embeddings", c.max_position_embeddings);
  get(d, "attention_bias", c.attention_bias);
  get(d, "mlp_bias", c.mlp_bias);
  get(d, "qk_norm", c.qk_norm);
  if (d.contains("rope_scaling") && !d["rope_scaling"].is_none()) {
    py::dict rs = d["rope_scaling"].cast<py::dict>();
    c.rope_scaling.enabled = true;
    get(rs, "factor", c.rope_scaling.factor);
    get(rs, "low_freq_factor", c.rope_scaling.low_freq_factor);
    get(rs, "high_freq_factor", c.rope_scaling.high_freq_factor);
    get(rs, "original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings);
  }
  c.validate();
  return c;
}

EngineConfig engine_config_from(const py::dict& d) {
  EngineConfig c;
  get(d, "mode", c.mode);
  get(d, "max_model_len", c.max_model_len);
  get(d, "max_batch", c.max_batch);
  get(d, "max_batched_tokens", c.max_batched_tokens);
  get(d, "kv_block_size", c.kv_block_size);
  get(d, "kv_capacity_tokens", c.kv_capacity_tokens);
  get(d, "dtype", c.dtype);
  get(d, "target_device", c.target_device);
  get(d, "target_threads", c.target_threads);
  get(d, "draft_device", c.draft_device);
  get(d, "draft_threads", c.draft_threads);
  get(d, "k", c.k);
  get(d, "fanout_list", c.fanout_list);
  get(d, "fanout_mode", c.fanout_mode);
  get(d, "fanout_budget", c.fanout_budget);
  get(d, "saguaro_c", c.saguaro_c);
  get(d, "fallback", c.fallback);
  get(d, "always_miss", c.always_miss);
  get(d, "draft_matmul_min_rows", c.draft_matmul_min_rows);
  c.validate();
  return c;
}

SamplingParams sampling_params_from(const py::dict& d) {
  SamplingParams p;
  get(d, "temperature", p.temperature);
  get(d, "top_k", p.top_k);
  get(d, "top_p", p.top_p);
  get(d, "max_tokens", p.max_tokens);
  get(d, "stop_token_ids", p.stop_token_ids);
  get(d, "ignore_eos", p.ignore_eos);
  if (d.contains("seed") && !d["seed"].is_none()) {
    p.has_seed = true;
    p.seed = d["seed"].cast<uint64_t>();
  }
  return p;
}

void add_speed(py::dict& d, const SpeedMetrics& m) {
  d["acceptance_rate"] = m.acceptance_rate;
  d["mean_accepted_len"] = m.mean_accepted_len;
  d["tokens_per_round"] = m.tokens_per_round;
  d["cache_hit_rate"] = m.cache_hit_rate;
  d["fast_acceptance_rate"] = m.fast_acceptance_rate;
  d["e_hit"] = m.e_hit;
  d["e_miss"] = m.e_miss;
  d["t_p"] = m.t_p;
  d["t_b"] = m.t_b;
  d["predicted_speedup"] = m.predicted_speedup;
  d["target_busy_fraction"] = m.target_busy_fraction;
}

py::dict metrics_dict(const RequestMetrics& m) {
  py::dict d;
  d["prompt_tokens"] = m.prompt_tokens;
  d["generated_tokens"] = m.generated_tokens;
  d["num_preemptions"] = m.num_preemptions;
  d["time_to_first_token"] = m.time_to_first_token;
  d["finish_time"] = m.finish_time;
  d["seed"] = m.seed;
  d["rounds"] = m.rounds;
  d["draft_tokens_proposed"] = m.draft_tokens_proposed;
  d["draft_tokens_accepted"] = m.draft_tokens_accepted;
  d["cache_lookups"] = m.cache_lookups;
  d["cache_hits"] = m.cache_hits;
  d["fallback_neural"] = m.fallback_neural;
  d["fallback_fast"] = m.fallback_fast;
  d["hit_tokens"] = m.hit_tokens;
  d["miss_tokens"] = m.miss_tokens;
  d["fast_tokens_proposed"] = m.fast_tokens_proposed;
  d["fast_tokens_accepted"] = m.fast_tokens_accepted;
  add_speed(d, speed_metrics(m));
  return d;
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  d["steps"] = s.steps;
  d["forward_tokens"] = s.forward_tokens;
  d["generated_tokens"] = s.generated_tokens;
  d["peak_batch"] = s.peak_batch;
  d["num_preemptions"] = s.num_preemptions;
  d["num_finished"] = s.num_finished;
  d["num_running"] = s.num_running;
  d["num_waiting"] = s.num_waiting;
  d["kv_blocks_total"] = s.kv_blocks_total;
  d["kv_blocks_free"] = s.kv_blocks_free;
  d["rounds"] = s.rounds;
  d["draft_tokens_proposed"] = s.draft_tokens_proposed;
  d["draft_tokens_accepted"] = s.draft_tokens_accepted;
  d["forward_seconds"] = s.forward_seconds;
  d["cache_lookups"] = s.cache_lookups;
  d["cache_hits"] = s.cache_hits;
  d["fallback_neural"] = s.fallback_neural;
  d["fallback_fast"] = s.fallback_fast;
  d["hit_tokens"] = s.hit_tokens;
  d["miss_tokens"] = s.miss_tokens;
  d["fast_tokens_proposed"] = s.fast_tokens_proposed;
  d["fast_tokens_accepted"] = s.fast_tokens_accepted;
  d["random_token_acceptance"] = s.random_token_acceptance;
  d["kv_commits"] = s.kv_commits;
  d["tree_branches"] = s.tree_branches;
  d["fanout_budget"] = s.fanout_budget;
  d["fanout"] = s.fanout;
  d["acceptance_estimate"] = s.acceptance_estimate;
  d["miss_exponent"] = s.miss_exponent;
  d["verify_steps"] = s.verify_steps;
  d["verify_seconds"] = s.verify_seconds;
  d["active_seconds"] = s.active_seconds;
  d["target_wait_seconds"] = s.target_wait_seconds;
  d["draft_rounds"] = s.draft_rounds;
  d["draft_round_seconds"] = s.draft_round_seconds;
  d["fallback_batches"] = s.fallback_batches;
  d["fallback_seconds"] = s.fallback_seconds;
  d["fallback_neural_estimate"] = s.fallback_neural_estimate;
  d["fallback_fast_estimate"] = s.fallback_fast_estimate;
  d["fast_shadow_rounds"] = s.fast_shadow_rounds;
  d["fast_shadow_tokens"] = s.fast_shadow_tokens;
  add_speed(d, speed_metrics(s));
  return d;
}

model::WeightMap weight_map_from(const py::dict& d) {
  model::WeightMap w;
  for (auto item : d) w.emplace(item.first.cast<std::string>(), item.second.cast<at::Tensor>());
  return w;
}

}  // namespace
}  // namespace ssd

PYBIND11_MODULE(_C, m) {
  using namespace ssd;
  m.doc() = "ssd C++ core";
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const std::invalid_argument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    }
  });

  m.def("speed_metrics", [](const py::dict& d) {
    // The speed model over counters (e.g. deltas of LLM.stats() between two points).
    EngineStats s;
    get(d, "rounds", s.rounds);
    get(d, "draft_tokens_proposed", s.draft_tokens_proposed);
    get(d, "draft_tokens_accepted", s.draft_tokens_accepted);
    get(d, "generated_tokens", s.generated_tokens);
    get(d, "cache_lookups", s.cache_lookups);
    get(d, "cache_hits", s.cache_hits);
    get(d, "hit_tokens", s.hit_tokens);
    get(d, "miss_tokens", s.miss_tokens);
    get(d, "fast_tokens_proposed", s.fast_tokens_proposed);
    get(d, "fast_tokens_accepted", s.fast_tokens_accepted);
    get(d, "verify_steps", s.verify_steps);
    get(d, "verify_seconds", s.verify_seconds);
    get(d, "draft_rounds", s.draft_rounds);
    get(d, "draft_round_seconds", s.draft_round_seconds);
    get(d, "fallback_batches", s.fallback_batches);
    get(d, "fallback_seconds", s.fallback_seconds);
    get(d, "forward_seconds", s.forward_seconds);
    get(d, "active_seconds", s.active_seconds);
    py::dict out;
    add_speed(out, speed_metrics(s));
    return out;
  });
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
  m.def("ngram_propose", &runtime::ngram_propose, py::arg("tokens"), py::arg("k"), py::arg("max_n") = 3);
  m.def("proposal_emitted", &runtime::proposal_emitted, py::arg("text"), py::arg("at"), py::arg("proposal"));
  m.def("validate_model_config", [](const py::dict& d) { model_config_from(d); });
  m.def("validate_engine_config", [](const py::dict& d) { engine_config_from(d); });
  m.def("validate_sampling_params",
        [](const py::dict& d, int64_t vocab) { sampling_params_from(d).validate(vocab); },
        py::arg("params"), py::arg("vocab_size") = 0);

  py::class_<model::Model, std::shared_ptr<model::Model>>(m, "Model")
      .def(py::init([](const py::dict& config, const py::dict& weights) {
             return std::make_shared<model::Model>(model_config_from(config), weight_map_from(weights));
           }),
           py::arg("config"), py::arg("weights"))
      .def_property_readonly("vocab_size", [](const model::Model& m) { return m.config().vocab_size; })
      .def_property_readonly("bf16", &model::Model::bf16);

  py::class_<model::SequenceRunner>(m, "SequenceRunner")
      .def(py::init<std::shared_ptr<model::Model>, int64_t, int64_t, int64_t>(), py::arg("model"),
           py::arg("num_blocks"), py::arg("block_size"), py::arg("num_threads") = 1)
      .def("add_sequence", &model::SequenceRunner::add_sequence)
      .def("extend", &model::SequenceRunner::extend, py::arg("batch"), py::arg("all_logits") = true,
           py::arg("matmul_min_rows") = 0,
           py::call_guard<py::gil_scoped_release>())
      .def("truncate", &model::SequenceRunner::truncate)
      .def("free", &model::SequenceRunner::free)
      .def("length", &model::SequenceRunner::length)
      .def("block_table", &model::SequenceRunner::block_table)
      .def("cache_storage", &model::SequenceRunner::cache_storage)
      .def_property_readonly("num_free_blocks", &model::SequenceRunner::num_free_blocks);

  py::class_<Engine>(m, "Engine")
      .def(py::init([](const py::dict& config, std::shared_ptr<model::Model> target,
                       std::vector<int32_t> eos, std::shared_ptr<model::Model> draft) {
             return std::make_unique<Engine>(engine_config_from(config), std::move(target),
                                             std::move(eos), std::move(draft));
           }),
           py::arg("config"), py::arg("target"), py::arg("eos_token_ids"), py::arg("draft") = nullptr)
      .def("enqueue",
           [](Engine& e, std::vector<int32_t> prompt, const py::dict& params) {
             return e.enqueue(Request{std::move(prompt), sampling_params_from(params)});
           })
      .def("enqueue_batch",
           [](Engine& e, const std::vector<std::pair<std::vector<int32_t>, py::dict>>& items) {
             std::vector<Request> requests;
             for (const auto& [prompt, params] : items) requests.push_back(Request{prompt, sampling_params_from(params)});
             return e.enqueue_batch(std::move(requests));
           },
           "[(prompt ids, params dict)] -> ids; all queued at once, or none (ValueError naming the index).")
      .def("await_responses",
           [](Engine& e, double timeout) {
             std::vector<Response> rs;
             {
               py::gil_scoped_release release;
               rs = e.await_responses(timeout);
             }
             py::list out;
             for (auto& r : rs) {
               py::dict d;
               d["id"] = r.id;
               d["tokens"] = r.tokens;
               d["finished"] = r.finished;
               d["finish_reason"] = r.finished ? py::object(py::str(finish_reason_name(r.finish_reason)))
                                               : py::object(py::none());
               d["error"] = r.error;
               if (r.finished) d["metrics"] = metrics_dict(r.metrics);
               out.append(d);
             }
             return out;
           },
           py::arg("timeout") = 0.1)
      .def("cancel", &Engine::cancel)
      .def("shutdown", &Engine::shutdown, py::call_guard<py::gil_scoped_release>())
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); });

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
          TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16,
                      "w must be float32 or bfloat16");
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
          if (bf16) {
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
  m.def("pairs_native", &kernels::pairs_native, "Whether the bf16 pair kernels use AVX512-BF16 instructions.");
  m.def("keyed_uniform", [](uint64_t seed, uint64_t position, uint64_t purpose) {
    return kernels::keyed_uniform(seed, position, static_cast<kernels::RandomPurpose>(purpose));
  });
}
