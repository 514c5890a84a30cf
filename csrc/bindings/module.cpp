// The pybind11 module ssd._C: a thin layer over the C++ core. Configs cross
// as dicts (the Python dataclasses mirror the C++ structs field by field);
// std::invalid_argument surfaces as ValueError.
#include <torch/extension.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

#include <pybind11/stl.h>

#include "../kernels/cpu/isa.h"
#include "../model/model.h"
#include "../model/runner.h"
#include "checkpoint_glue.h"
#include "collective_glue.h"
#include "ssd/engine.h"
#include "ssd/log.h"
#include "ssd/speed_model.h"

namespace py = pybind11;

namespace ssd {
void bind_testing(py::module_ m);  // testing_module.cpp
}

namespace ssd {
namespace {

// A value that does not convert (a string for a size, an integer beyond
// int64) is a bad value of that field: ValueError, like the checks of validate().
template <typename T>
void get(const py::dict& d, const char* key, T& out) {
  if (!d.contains(key) || d[key].is_none()) return;
  try {
    out = d[key].cast<T>();
  } catch (const py::cast_error&) {
    const char* wanted = std::is_same_v<T, bool>             ? "a bool"
                         : std::is_integral_v<T>             ? "an integer within int64"
                         : std::is_floating_point_v<T>       ? "a number"
                         : std::is_same_v<T, std::vector<double>> ? "a list of numbers"
                                                             : "another type";
    throw std::invalid_argument(std::string(key) + ": must be " + wanted + ", got " +
                                py::repr(d[key]).cast<std::string>());
  }
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
  get(d, "qkv_bias", c.qkv_bias);
  get(d, "mlp_bias", c.mlp_bias);
  get(d, "qk_norm", c.qk_norm);
  get(d, "sliding_window", c.sliding_window);
  get(d, "rope_freq_factors", c.rope_freq_factors);
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

// The fields only; engine_config_from validates them too.
EngineConfig engine_config_fields(const py::dict& d) {
  EngineConfig c;
  get(d, "mode", c.mode);
  get(d, "max_model_len", c.max_model_len);
  get(d, "max_batch", c.max_batch);
  get(d, "max_batched_tokens", c.max_batched_tokens);
  get(d, "kv_block_size", c.kv_block_size);
  get(d, "kv_capacity_tokens", c.kv_capacity_tokens);
  get(d, "kv_cache_gib", c.kv_cache_gib);
  get(d, "dtype", c.dtype);
  get(d, "draft_dtype", c.draft_dtype);
  get(d, "quant_activations", c.quant_activations);
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
  get(d, "coupling", c.coupling);
  get(d, "draft_matmul_min_rows", c.draft_matmul_min_rows);
  get(d, "batch_invariant", c.batch_invariant);
  get(d, "cuda_graphs", c.cuda_graphs);
  get(d, "draft_sm_share", c.draft_sm_share);
  get(d, "backend", c.backend);
  get(d, "kv_cache_dtype", c.kv_cache_dtype);
  get(d, "adaptive", c.adaptive);
  get(d, "tensor_parallel_size", c.tensor_parallel_size);
  get(d, "tensor_parallel_timeout_s", c.tensor_parallel_timeout_s);
  get(d, "tensor_parallel_init", c.tensor_parallel_init);
  return c;
}

EngineConfig engine_config_from(const py::dict& d) {
  EngineConfig c = engine_config_fields(d);
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
  get(d, "logprobs", p.logprobs);
  if (d.contains("seed") && !d["seed"].is_none()) {
    p.has_seed = true;
    p.seed = d["seed"].cast<uint64_t>();
  }
  return p;
}

TestingConfig testing_config_from(const py::dict& d) {
  TestingConfig t;
  const std::pair<const char*, bool*> switches[] = {
      {"always_miss", &t.always_miss},
      {"auto_alternate", &t.auto_alternate},
      {"fault_fast_argmax", &t.fault_fast_argmax},
      {"fault_resume_stream", &t.fault_resume_stream},
      {"fault_truncated_q", &t.fault_truncated_q},
      {"fault_batch_top_kp", &t.fault_batch_top_kp},
      {"fault_worker_dies", &t.fault_worker_dies},
      {"fault_shared_noise", &t.fault_shared_noise},
      {"fault_peek_target", &t.fault_peek_target},
  };
  for (auto item : d) {
    const auto key = item.first.cast<std::string>();
    if (key != "tree_blocks" && key != "forced_lookahead" && key != "draft_answer_delay_ms" &&
        key != "fake_devices" &&
        std::none_of(std::begin(switches), std::end(switches), [&](const auto& s) { return key == s.first; }))
      throw std::invalid_argument("testing: unknown switch '" + key + "'");
  }
  for (const auto& [key, flag] : switches) get(d, key, *flag);
  get(d, "tree_blocks", t.tree_blocks);
  get(d, "draft_answer_delay_ms", t.draft_answer_delay_ms);
  get(d, "forced_lookahead", t.forced_lookahead);
  if (d.contains("fake_devices") && !d["fake_devices"].is_none()) {
    // {"host_bytes": n, "cuda": [(free_bytes, total_bytes), ...]}
    const py::dict fake = d["fake_devices"].cast<py::dict>();
    MachineDevices m;
    int64_t host = 0;
    get(fake, "host_bytes", host);
    m.host = {host, host};
    std::vector<std::pair<int64_t, int64_t>> cuda;
    get(fake, "cuda", cuda);
    for (const auto& [free_bytes, total_bytes] : cuda) m.cuda.push_back({free_bytes, total_bytes});
    t.fake_devices = m;
  }
  return t;
}

// Every listed field of `obj` (see fields() in ssd/types.h) into `d`.
template <class T>
void put_fields(py::dict& d, const T& obj) {
  T::fields([&](const char* name, auto member) { d[name] = obj.*member; });
}

template <class T>
void get_fields(const py::dict& d, T& obj) {
  T::fields([&](const char* name, auto member) { get(d, name, obj.*member); });
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
  d["mean_batch"] = m.mean_batch;
  d["predicted_speedup"] = m.predicted_speedup;
  d["target_busy_fraction"] = m.target_busy_fraction;
  d["round_host_bytes_per_step"] = m.round_host_bytes_per_step;
}

py::dict metrics_dict(const RequestMetrics& m) {
  py::dict d;
  put_fields(d, m);
  put_fields(d, m.spec);
  add_speed(d, speed_metrics(m));
  return d;
}

py::dict stats_dict(const EngineStats& s) {
  py::dict d;
  put_fields(d, s.steps);
  put_fields(d, s.spec);
  put_fields(d, s.draft);
  put_fields(d, s.adaptive);
  put_fields(d, s.engine);
  put_fields(d, s.plan);
  put_fields(d, s.policy);
  add_speed(d, speed_metrics(s));
  return d;
}

// The names of the summed counters (deltas between two stats() are meaningful).
std::vector<std::string> counter_names() {
  std::vector<std::string> names;
  auto add = [&](const char* name, auto) { names.emplace_back(name); };
  StepCounters::fields(add);
  SpecCounters::fields(add);
  DraftCounters::fields(add);
  AdaptiveCounters::fields(add);
  return names;
}

model::WeightMap weight_map_from(const py::dict& d) {
  model::WeightMap w;
  for (auto item : d) w.emplace(item.first.cast<std::string>(), item.second.cast<at::Tensor>());
  return w;
}


// The speed model and the counters it reads.
void bind_speed_model(py::module_& m) {
  m.def(
      "speed_metrics",
      [](const py::dict& d) {
        EngineStats s;
        get_fields(d, s.steps);
        get_fields(d, s.spec);
        get_fields(d, s.draft);
        py::dict out;
        add_speed(out, speed_metrics(s));
        return out;
      },
      py::arg("counters"),
      "The speed model over counters (e.g. deltas of LLM.stats() between two points; names: counter_names()).");
  m.def("counter_names", &counter_names, "The summed counters of stats(): their deltas are meaningful.");
  m.def(
      "predict_round",
      [](double p_hit, double e_hit, double e_miss, double t_p, double t_b, int64_t batch, double verify_cost,
         bool overlapped) {
        const RoundPrediction r = predict_round({p_hit, e_hit, e_miss, t_p, t_b, batch, verify_cost, overlapped});
        py::dict d;
        d["p_all_hit"] = r.p_all_hit;
        d["tokens"] = r.tokens;
        d["time"] = r.time;
        d["speedup"] = r.speedup;
        return d;
      },
      py::arg("p_hit") = 1.0, py::arg("e_hit") = 0.0, py::arg("e_miss") = 0.0, py::arg("t_p") = 0.0,
      py::arg("t_b") = 0.0, py::arg("batch") = 1, py::arg("verify_cost") = 1.0, py::arg("overlapped") = true,
      "The one round-cost model (csrc/include/ssd/speed_model.h): {p_all_hit, tokens, time, speedup}; "
      "times in verify forwards, speedup over ar.");
  m.def(
      "plan_step",
      [](const std::string& drafting, const std::vector<double>& first, int64_t k,
         const std::vector<std::pair<int64_t, double>>& forward, double draft_step, double tree, double fallback,
         double hit_rate, double contention, double tree_per_verify, std::optional<std::vector<double>> next) {
        static const std::pair<const char*, Drafting> kinds[] = {{"none", Drafting::kNone},
                                                                 {"sequential", Drafting::kSequential},
                                                                 {"trees", Drafting::kTrees},
                                                                 {"misses", Drafting::kMisses}};
        const auto kind = std::find_if(std::begin(kinds), std::end(kinds),
                                       [&](const auto& x) { return drafting == x.first; });
        if (kind == std::end(kinds))
          throw std::invalid_argument("drafting: must be 'none', 'sequential', 'trees' or 'misses', got '" +
                                      drafting + "'");
        CostCurve curve;
        for (const auto& [rows, seconds] : forward) curve.observe(rows, seconds);
        StepCosts costs;
        costs.forward = &curve;
        costs.draft_step = draft_step;
        costs.tree = tree;
        costs.tree_per_verify = tree_per_verify;
        costs.contention = contention;
        costs.fallback = fallback;
        costs.hit_rate = hit_rate;
        if (next && next->size() != first.size())
          throw std::invalid_argument("continuation: one per sequence (" + std::to_string(first.size()) +
                                      "), got " + std::to_string(next->size()));
        std::vector<Acceptance> acceptance;
        for (size_t i = 0; i < first.size(); ++i) acceptance.push_back({first[i], next ? (*next)[i] : first[i]});
        const StepPlan plan = plan_step(kind->second, acceptance, k, costs);
        std::vector<int64_t> lookaheads;
        for (const Acceptance& a : acceptance) lookaheads.push_back(lookahead_for(a, plan.threshold, k));
        py::dict d;
        d["threshold"] = plan.threshold;
        d["tokens"] = plan.tokens;
        d["seconds"] = plan.seconds;
        d["tokens_per_second"] = plan.tokens_per_second();
        d["lookaheads"] = lookaheads;
        return d;
      },
      py::arg("drafting"), py::arg("acceptance"), py::arg("k"), py::arg("forward"), py::arg("draft_step") = 0.0,
      py::arg("tree") = 0.0, py::arg("fallback") = 0.0, py::arg("hit_rate") = 0.0, py::arg("contention") = 1.0,
      py::arg("tree_per_verify") = 0.0, py::arg("continuation") = py::none(),
      "The adaptive policy's step model (csrc/include/ssd/speed_model.h): the best plan of one drafting kind "
      "for sequences whose first proposal is kept with probability acceptance[i] and each later one, after a "
      "kept one, with continuation[i] (None: the same), forward = [(rows, seconds), ...] measured; "
      "{threshold, tokens, seconds, tokens_per_second, lookaheads}.");
}

// The C++ log records, drained by python/ssd/_logging.py.
void bind_logging(py::module_& m) {
  m.def("set_log_level", [](int level) { log::set_level(static_cast<log::Level>(level)); }, py::arg("level"),
        "Records below this Python logging level are dropped in C++ (default: off).");
  m.def(
      "drain_log",
      []() {
        py::list out;
        for (const auto& r : log::drain()) out.append(py::make_tuple(static_cast<int>(r.level), r.message));
        return out;
      },
      "The queued C++ log records, oldest first, as (level, message).");
}

// Config validation and checkpoint loading.
void bind_config(py::module_& m) {
  m.def("validate_model_config", [](const py::dict& d) { model_config_from(d); });
  checkpoint_glue::bind(m, &model_config_from);
  m.def("validate_engine_config", [](const py::dict& d) { engine_config_from(d); });
  m.def("validate_sampling_params",
        [](const py::dict& d, int64_t vocab) { sampling_params_from(d).validate(vocab); },
        py::arg("params"), py::arg("vocab_size") = 0);
}

// EngineConfig::resolve for given model configs, against the testing
// config's fake devices: placements and KV budgets without a GPU.
void bind_config_testing(py::module_& m) {
  m.def(
      "resolve_engine_config",
      [](const py::dict& config, const py::dict& target, const py::object& draft, const py::dict& testing) {
        EngineConfig c = engine_config_fields(config);
        const ModelConfig t = model_config_from(target);
        std::optional<ModelConfig> d;
        if (!draft.is_none()) d = model_config_from(draft.cast<py::dict>());
        c.resolve(t, d ? &*d : nullptr, testing_config_from(testing));
        py::dict out;
        out["max_model_len"] = c.max_model_len;
        out["kv_capacity_tokens"] = c.kv_capacity_tokens;
        return out;
      },
      py::arg("config"), py::arg("target"), py::arg("draft"), py::arg("testing"),
      "EngineConfig::validate and resolve (config: EngineConfig.to_dict(), target / draft: model config dicts) "
      "against testing's fake_devices; the resolved {max_model_len, kv_capacity_tokens}.");
}

// Models and a sequence runner over their paged KV cache.
void bind_models(py::module_& m) {
  py::class_<model::Model, std::shared_ptr<model::Model>>(m, "Model")
      .def(py::init([](const py::dict& config, const py::dict& weights, const std::string& device,
                       const std::string& backend, bool batch_invariant,
                       const std::map<std::string, std::string>& formats, bool int8_activations,
                       const py::object& tensor_parallel, bool cuda_graphs, double draft_sm_share) {
             model::ModelPlacement placement{
                 device, backend,
                 model::BackendOptions{batch_invariant, int8_activations, cuda_graphs, draft_sm_share},
                                             bindings::tensor_parallel_from(tensor_parallel)};
             model::FormatMap format_map;
             for (const auto& [name, format] : formats) format_map.emplace(name, kernels::quant_type(format));
             return std::make_shared<model::Model>(model_config_from(config), weight_map_from(weights), placement,
                                                   format_map);
           }),
           py::arg("config"), py::arg("weights"), py::arg("device") = "cpu", py::arg("backend") = "auto",
           py::arg("batch_invariant") = true, py::arg("formats") = std::map<std::string, std::string>{},
           py::arg("int8_activations") = true, py::arg("tensor_parallel") = py::none(), py::arg("cuda_graphs") = true,
           py::arg("draft_sm_share") = 0.0,
           "weights: HF name -> tensor; formats: name -> GGUF block format (q8_0, q4_0, q4_1) of the weights "
           "passed as uint8 GGUF rows [n, row bytes]; int8_activations: those matrices multiply int8 "
           "activations (else fp32 ones: exactly the dequantised model); tensor_parallel: None, or (rank, size, "
           "all_gather, broadcast) to hold that rank's shard (model/tensor_parallel.h; ssd.distributed); "
           "cuda_graphs: the cuda backend replays a CUDA graph per padded forward shape (model/forward_shape.h); "
           "draft_sm_share: its draft role's kernels on that share of the SMs (a green context; 0: all).")
      .def("lead", &model::Model::lead, py::arg("on") = true,
           "Rank 0 of a tensor-parallel group: each forward first sends its input to the ranks in follow().")
      .def("follow", &model::Model::follow, py::arg("num_threads") = 1, py::call_guard<py::gil_scoped_release>(),
           "Ranks 1..: run every forward rank 0 leads, on this shard, until rank 0 calls stop_followers().")
      .def("stop_followers", &model::Model::stop_followers, py::call_guard<py::gil_scoped_release>(),
           "Rank 0, leading: ends the other ranks' follow().")
      .def("ping_followers", &model::Model::ping_followers, py::arg("quiet_s") = 0.0,
           py::call_guard<py::gil_scoped_release>(),
           "Rank 0, leading: when nothing was sent for quiet_s seconds, tells the followers it is alive; True when "
           "it did.")
      .def_property_readonly("collective_calls", &model::Model::collective_calls,
                             "Tensor-parallel all-gathers so far (two per layer and forward).")
      .def_property_readonly("collective_seconds", &model::Model::collective_seconds,
                             "Seconds spent in them, summing included.")
      .def_property_readonly("vocab_size", [](const model::Model& m) { return m.config().vocab_size; })
      .def_property_readonly("bf16", &model::Model::bf16)
      .def_property_readonly("weight_bytes", &model::Model::weight_bytes,
                             "Bytes the backend holds for the weights (matrices, embedding, vectors).")
      .def_property_readonly("device", &model::Model::device)
      .def_property_readonly("backend", [](const model::Model& m) { return m.backend().name(); })
      .def(
          "graph_counts",
          [](const model::Model& m) {
            const model::GraphCounts c = m.backend().graph_counts();
            return py::dict(py::arg("captured") = c.captured, py::arg("replayed") = c.replayed,
                            py::arg("evicted") = c.evicted, py::arg("failed") = c.failed);
          },
          "The CUDA graphs of this model's forwards: {captured, replayed, evicted, failed} (zeros off the cuda "
          "backend).");
  m.def("available_backends", &model::available_backends,
        "The model backends this build can run here: 'cpu', 'aten' and, with CUDA, 'cuda'.");
  m.def("device_problem", &model::device_problem, py::arg("device"),
        "'' when the device string names a usable device, else why not.");
  m.def("cpu_isa", [] { return std::string(kernels::isa_name(kernels::active_isa())); },
        "The instruction set the CPU kernels run on now: 'avx512_vnni', 'avx512', 'avx2' or 'portable'.");
  m.def("cpu_isas",
        [] {
          std::vector<std::string> names;
          for (kernels::Isa isa : kernels::supported_isas()) names.emplace_back(kernels::isa_name(isa));
          return names;
        },
        "The instruction sets this CPU can run the kernels on, portable first.");
  m.def("set_cpu_isa", &kernels::set_isa, py::arg("name"),
        "Runs the CPU kernels on this instruction set from the next kernel call on, in every thread (all give "
        "the same bits; for tests and benchmarks). ValueError for a name this CPU cannot run.");

  py::class_<model::SequenceRunner>(m, "SequenceRunner")
      .def(py::init<std::shared_ptr<model::Model>, int64_t, int64_t, int64_t, const std::string&>(),
           py::arg("model"), py::arg("num_blocks"), py::arg("block_size"), py::arg("num_threads") = 1,
           py::arg("kv_dtype") = "float32")
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
}

// The engine: dicts in, dicts out.
void bind_engine(py::module_& m) {
  py::class_<Engine>(m, "Engine")
      .def(py::init([](const py::dict& config, std::shared_ptr<model::Model> target, std::vector<int32_t> eos,
                       std::shared_ptr<model::Model> draft, const py::dict& testing) {
             return std::make_unique<Engine>(engine_config_from(config), std::move(target), std::move(eos),
                                             std::move(draft), testing_config_from(testing));
           }),
           py::arg("config"), py::arg("target"), py::arg("eos_token_ids"), py::arg("draft") = nullptr,
           py::arg("testing") = py::dict())
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
               if (!r.logprobs.empty()) {
                 py::list lps;
                 for (const auto& lp : r.logprobs) {
                   py::list top;
                   for (size_t j = 0; j < lp.top_tokens.size(); ++j)
                     top.append(py::make_tuple(lp.top_tokens[j], lp.top_logprobs[j]));
                   lps.append(py::make_tuple(lp.logprob, top));
                 }
                 d["logprobs"] = lps;
               }
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
      .def("stats", [](const Engine& e) { return stats_dict(e.stats()); })
      .def("failure", &Engine::failure,
           "Why the engine has failed (a tensor-parallel rank lost: every request ended with an error and new "
           "ones are refused), or '' while it works.")
      .def("config", [](const Engine& e) {
             // The resolved values of the fields the engine fills in.
             const EngineConfig& c = e.config();
             py::dict d;
             d["max_model_len"] = c.max_model_len;
             d["kv_capacity_tokens"] = c.kv_capacity_tokens;
             return d;
           },
           "The automatic fields as the engine resolved them.");
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
  bind_speed_model(m);
  bind_logging(m);
  bind_config(m);
  bind_models(m);
  bind_engine(m);
  py::module_ testing = m.def_submodule("testing", "Test-only entry points into the core's pieces (not a product API).");
  bind_testing(testing);
  bind_config_testing(testing);
}
