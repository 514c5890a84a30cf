// ssd_generate: loads a HuggingFace model directory and generates on token
// ids with the same Engine the Python LLM drives; no Python in the process.
//
//   ssd_generate MODEL_DIR [options] -- 1 2 3 , 4 5
//
// stdout: one line per prompt, the generated token ids. stderr: one line per
// prompt with its finish reason. Exit status: 0 ok, 1 the model could not be
// loaded or a request failed, 2 bad arguments.
#include <algorithm>
#include <charconv>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../model/checkpoint.h"
#include "../model/model.h"
#include "ssd/engine.h"
#include "ssd/log.h"
#include "ssd/speed_model.h"

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr const char* kUsage =
    "usage: ssd_generate MODEL_DIR [options] -- TOKEN_ID... [, TOKEN_ID...]...\n"
    "\n"
    "Generates for each prompt (token ids; prompts are separated by ',') and prints\n"
    "the generated ids, one line per prompt; finish reasons go to stderr.\n"
    "\n"
    "options:\n"
    "  --mode ar|sd|ssd       decoding mode (default ar; sd and ssd need --draft)\n"
    "  --draft DIR            draft model directory (modes sd, ssd)\n"
    "  --k N                  draft tokens per round (default 4)\n"
    "  --fanout confidence|geometric|F0,..,FK  ssd fan-out (default confidence)\n"
    "  --fanout-budget auto|B ssd fan-out budget (default auto)\n"
    "  --saguaro-c C          ssd SAGUARO sampling C in [0, 1] (default 1)\n"
    "  --fallback auto|neural|fast  ssd speculator on a cache miss (default auto)\n"
    "  --coupling rejection|gumbel  how draws are coupled (default gumbel)\n"
    "  --stats                print the engine's speed metrics to stderr\n"
    "  --log-level debug|info|warning  print the engine's decisions at this level to stderr (default: none)\n"
    "  --draft-threads N      CPU threads of the draft's forward (default 1)\n"
    "  --max-tokens N         tokens to generate per prompt (default 16)\n"
    "  --temperature T        0 is greedy (default 1.0)\n"
    "  --top-k K              0 or -1 disables (default 0)\n"
    "  --top-p P              1 disables (default 1.0)\n"
    "  --seed S               seed of every prompt's random stream (default: random)\n"
    "  --threads N            CPU threads of the forward (default 1)\n"
    "  --max-model-len N      prompt + generated tokens (default min(2048, model's max))\n"
    "  --dtype float32|bfloat16  weight storage (default float32)\n"
    "  --ignore-eos           do not stop at the model's eos tokens\n"
    "  -h, --help             show this help\n";

struct UsageError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct Options {
  std::string model_dir;
  std::string draft_dir;
  bool stats = false;
  ssd::EngineConfig engine;
  std::optional<int64_t> max_model_len;
  ssd::SamplingParams sampling;
  std::vector<std::vector<int32_t>> prompts;
};

template <typename T>
T parse_number(const std::string& flag, std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    throw UsageError(flag + ": expected " + (std::is_integral_v<T> ? "an integer" : "a number") +
                     ", got '" + std::string(text) + "'");
  return value;
}

std::vector<std::vector<int32_t>> parse_prompts(int argc, char** argv, int first) {
  std::vector<std::vector<int32_t>> prompts(1);
  for (int i = first; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == ",") {
      prompts.emplace_back();
    } else {
      prompts.back().push_back(parse_number<int32_t>("token id", arg));
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].empty())
      throw UsageError("prompt " + std::to_string(i) + " is empty (give token ids after '--', prompts separated by ',')");
  return prompts;
}

void apply_option(Options& o, const std::string& flag, const std::string& value) {
  auto& s = o.sampling;
  if (flag == "--mode") {
    o.engine.mode = value;
  } else if (flag == "--draft") {
    o.draft_dir = value;
  } else if (flag == "--k") {
    o.engine.k = parse_number<int64_t>(flag, value);
  } else if (flag == "--fanout") {
    o.engine.fanout_list.clear();
    if (value == "confidence" || value == "geometric") {
      o.engine.fanout_mode = value;
    } else {
      std::stringstream items(value);
      std::string item;
      while (std::getline(items, item, ',')) o.engine.fanout_list.push_back(parse_number<int64_t>(flag, item));
    }
  } else if (flag == "--fanout-budget") {
    o.engine.fanout_budget = value == "auto" ? 0 : parse_number<int64_t>(flag, value);
    if (value != "auto" && o.engine.fanout_budget < 1)
      throw UsageError("--fanout-budget: must be 'auto' or an integer >= 1, got '" + value + "'");
  } else if (flag == "--saguaro-c") {
    o.engine.saguaro_c = parse_number<double>(flag, value);
  } else if (flag == "--fallback") {
    o.engine.fallback = value;
  } else if (flag == "--coupling") {
    o.engine.coupling = value;
  } else if (flag == "--log-level") {
    const std::map<std::string, ssd::log::Level> levels = {
        {"debug", ssd::log::Level::kDebug}, {"info", ssd::log::Level::kInfo}, {"warning", ssd::log::Level::kWarning}};
    const auto it = levels.find(value);
    if (it == levels.end()) throw UsageError("--log-level: must be debug, info or warning, got '" + value + "'");
    ssd::log::set_level(it->second);
    ssd::log::set_sink([](const ssd::log::Record& r) { std::cerr << "ssd: " << r.message << "\n"; });
  } else if (flag == "--draft-threads") {
    o.engine.draft_threads = parse_number<int64_t>(flag, value);
  } else if (flag == "--max-tokens") {
    s.max_tokens = parse_number<int64_t>(flag, value);
  } else if (flag == "--temperature") {
    s.temperature = parse_number<double>(flag, value);
  } else if (flag == "--top-k") {
    s.top_k = parse_number<int64_t>(flag, value);
    if (s.top_k == -1) s.top_k = 0;  // -1 disables, as in Python's SamplingParams
  } else if (flag == "--top-p") {
    s.top_p = parse_number<double>(flag, value);
  } else if (flag == "--seed") {
    s.seed = parse_number<uint64_t>(flag, value);
    s.has_seed = true;
  } else if (flag == "--threads") {
    o.engine.target_threads = parse_number<int64_t>(flag, value);
  } else if (flag == "--max-model-len") {
    o.max_model_len = parse_number<int64_t>(flag, value);
  } else if (flag == "--dtype") {
    o.engine.dtype = value;
  } else {
    throw UsageError("unknown option '" + flag + "'");
  }
}

// Parses the command line; returns nullopt for --help.
std::optional<Options> parse_args(int argc, char** argv) {
  Options o;
  bool have_prompts = false;
  for (int i = 1; i < argc && !have_prompts; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      o.prompts = parse_prompts(argc, argv, i + 1);
      have_prompts = true;
    } else if (arg == "-h" || arg == "--help") {
      return std::nullopt;
    } else if (arg == "--stats") {
      o.stats = true;
    } else if (arg == "--ignore-eos") {
      o.sampling.ignore_eos = true;
    } else if (arg.empty() || arg[0] != '-') {
      if (!o.model_dir.empty()) throw UsageError("unexpected argument '" + arg + "' (token ids go after '--')");
      o.model_dir = arg;
    } else if (const auto eq = arg.find('='); eq != std::string::npos) {  // --flag=VALUE
      apply_option(o, arg.substr(0, eq), arg.substr(eq + 1));
    } else if (i + 1 < argc) {  // --flag VALUE
      apply_option(o, arg, argv[++i]);
    } else {
      throw UsageError(arg + ": missing value");
    }
  }
  if (o.model_dir.empty()) throw UsageError("missing MODEL_DIR");
  if (!have_prompts) throw UsageError("missing prompt token ids (after '--')");
  if (o.max_model_len) o.engine.max_model_len = *o.max_model_len;
  // Size the batch (and with it the KV cache) to the prompts given.
  o.engine.max_batch = std::min<int64_t>(o.engine.max_batch, static_cast<int64_t>(o.prompts.size()));
  try {
    o.engine.validate();
    o.sampling.validate(0);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  return o;
}

struct Result {
  std::vector<int32_t> tokens;
  ssd::FinishReason reason = ssd::FinishReason::kNone;
  std::string error;
};

// Enqueues every prompt, then collects responses until all have finished.
std::vector<Result> generate(ssd::Engine& engine, const Options& o) {
  std::map<ssd::RequestId, size_t> index_of;
  for (size_t i = 0; i < o.prompts.size(); ++i) {
    try {
      index_of[engine.enqueue({o.prompts[i], o.sampling})] = i;
    } catch (const std::invalid_argument& e) {
      throw UsageError("prompt " + std::to_string(i) + ": " + e.what());
    }
  }
  std::vector<Result> results(o.prompts.size());
  size_t remaining = results.size();
  while (remaining > 0) {
    for (const ssd::Response& r : engine.await_responses(0.1)) {
      Result& out = results[index_of.at(r.id)];
      out.tokens.insert(out.tokens.end(), r.tokens.begin(), r.tokens.end());
      if (!r.finished) continue;
      out.reason = r.finish_reason;
      out.error = r.error;
      --remaining;
    }
  }
  return results;
}

int run(const Options& o) {
  const at::ScalarType dtype = ssd::model::weight_dtype(o.engine.dtype);
  std::shared_ptr<ssd::model::Model> model, draft;
  std::vector<int32_t> eos;
  try {
    ssd::model::Checkpoint ckpt = ssd::model::load_checkpoint(o.model_dir, dtype);
    model = std::make_shared<ssd::model::Model>(ckpt.config, ckpt.weights);
    eos = std::move(ckpt.eos_token_ids);
    if (!o.draft_dir.empty()) {
      ssd::model::Checkpoint d = ssd::model::load_checkpoint(o.draft_dir, dtype);
      draft = std::make_shared<ssd::model::Model>(d.config, d.weights);
    }
  } catch (const std::exception& e) {
    std::cerr << "ssd_generate: cannot load model: " << e.what() << "\n";
    return kExitFailure;
  }

  // The engine fills max_model_len (0: what the model supports) and checks it.
  ssd::EngineConfig config = o.engine;
  std::unique_ptr<ssd::Engine> engine;
  try {
    engine = std::make_unique<ssd::Engine>(config, model, eos, draft);
  } catch (const std::invalid_argument& e) {
    throw UsageError(e.what());
  }
  const std::vector<Result> results = generate(*engine, o);
  if (o.stats) {
    const ssd::EngineStats st = engine->stats();
    const ssd::SpeedMetrics m = ssd::speed_metrics(st);
    std::cerr << "stats: rounds=" << st.spec.rounds << " acceptance_rate=" << m.acceptance_rate
              << " cache_hit_rate=" << m.cache_hit_rate << " fallback_neural=" << st.spec.fallback_neural
              << " fallback_fast=" << st.spec.fallback_fast << " kv_commits=" << st.draft.kv_commits
              << " e_hit=" << m.e_hit << " e_miss=" << m.e_miss << " t_p=" << m.t_p << " t_b=" << m.t_b
              << " predicted_speedup=" << m.predicted_speedup
              << " target_busy_fraction=" << m.target_busy_fraction << "\n";
  }
  engine->shutdown();

  int status = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    std::string line;
    for (int32_t t : results[i].tokens) line += (line.empty() ? "" : " ") + std::to_string(t);
    std::cout << line << "\n";
    std::cerr << "prompt " << i << ": finish_reason=" << ssd::finish_reason_name(results[i].reason)
              << " tokens=" << results[i].tokens.size();
    if (!results[i].error.empty()) std::cerr << " error=" << results[i].error;
    std::cerr << "\n";
    if (results[i].reason == ssd::FinishReason::kError) status = kExitFailure;
  }
  std::cout.flush();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::optional<Options> options = parse_args(argc, argv);
    if (!options) {
      std::cout << kUsage;
      return 0;
    }
    return run(*options);
  } catch (const UsageError& e) {
    std::cerr << "ssd_generate: " << e.what() << "\n\n" << kUsage;
    return kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "ssd_generate: " << e.what() << "\n";
    return kExitFailure;
  }
}
