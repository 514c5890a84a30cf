#include "isa.h"

#include <atomic>
#include <stdexcept>

namespace ssd::kernels {

namespace {

bool detect(Isa isa) {
#if defined(__x86_64__) && defined(SSD_X86_ISAS)
  __builtin_cpu_init();
  switch (isa) {
    // Exactly the extensions CMakeLists.txt compiles each copy with.
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
    case Isa::avx512_vnni: return detect(Isa::avx512) && __builtin_cpu_supports("avx512vnni");
    case Isa::avx2:  // F16C: half weights (every AVX2 CPU has it)
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    default: return true;
  }
#else
  return isa == Isa::portable;  // a build without the x86 copies
#endif
}

// Asked once: the pair kernels' check runs on every draft product.
bool cpu_has(Isa isa) {
  static const bool has[4] = {true, detect(Isa::avx2), detect(Isa::avx512), detect(Isa::avx512_vnni)};
  return has[static_cast<int>(isa)];
}

Isa best_isa() {
  for (Isa isa : {Isa::avx512_vnni, Isa::avx512, Isa::avx2})
    if (cpu_has(isa)) return isa;
  return Isa::portable;
}

std::atomic<Isa>& chosen() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512: return "avx512";
    case Isa::avx512_vnni: return "avx512_vnni";
    case Isa::avx2: return "avx2";
    default: return "portable";
  }
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512_vnni})
    if (cpu_has(isa)) out.push_back(isa);
  return out;
}

Isa active_isa() { return chosen().load(std::memory_order_relaxed); }

void set_isa(const std::string& name) {
  std::string names;
  for (Isa isa : supported_isas()) {
    if (name == isa_name(isa)) {
      chosen().store(isa, std::memory_order_relaxed);
      return;
    }
    names += std::string(names.empty() ? "" : ", ") + isa_name(isa);
  }
  for (Isa isa : {Isa::portable, Isa::avx2, Isa::avx512, Isa::avx512_vnni})
    if (name == isa_name(isa))
      throw std::invalid_argument("cpu_isa '" + name + "': this CPU cannot run it (it runs: " + names + ")");
  throw std::invalid_argument("cpu_isa '" + name + "' is not one of portable, avx2, avx512, avx512_vnni (this CPU runs: " + names +
                              ")");
}

bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && defined(SSD_X86_ISAS)
  static const bool has = cpu_has(Isa::avx512) && (__builtin_cpu_init(), __builtin_cpu_supports("avx512bf16"));
  return has;
#else
  return false;
#endif
}

}  // namespace ssd::kernels
