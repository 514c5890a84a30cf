// Which instruction set the CPU kernels run on. The vector kernels
// (kernels/cpu/isa: the packed products, attention, norms) are compiled three
// times, for AVX-512 (F, BW, VL, DQ + FMA), AVX2 + FMA and portable C++, into
// namespaces of those names; the public functions dispatch to the best one
// the CPU has, or to the one set_isa chose. All three give the same bits (one
// operation order per output element, vec.h), so a forward may switch between
// them and a model's outputs do not depend on the choice. (The draft's bf16
// pair kernels are another matter: they run where the CPU has AVX512-BF16,
// whatever the choice; linear.h.) avx512_vnni is avx512 with one kernel of
// its own: the int8-activation quantized product on vpdpbusd (quant.h),
// bitwise the others'.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fork_attention.h"
#include "linear.h"
#include "ops.h"
#include "paged_attention.h"
#include "quant.h"
#include "row_runs.h"
#include "thread_pool.h"

namespace ssd::kernels {

enum class Isa : int { portable = 0, avx2 = 1, avx512 = 2, avx512_vnni = 3 };

/// "portable", "avx2", "avx512" or "avx512_vnni".
const char* isa_name(Isa isa);
/// The instruction sets this CPU (and build) can run, portable first.
std::vector<Isa> supported_isas();
/// The one the kernels use now: the best supported unless set_isa chose one.
Isa active_isa();
/// Chooses the kernels' instruction set by name for every thread (the next
/// kernel call uses it). Throws std::invalid_argument for an unknown name or
/// one this CPU cannot run, naming the choices.
void set_isa(const std::string& name);
/// Whether the CPU has AVX512-BF16 (the pair kernels' native instructions).
bool cpu_has_avx512_bf16();

namespace portable {
#include "isa/entry_points.inc"
}
namespace avx2 {
#include "isa/entry_points.inc"
}
namespace avx512 {
#include "isa/entry_points.inc"
}
namespace avx512_vnni {  // isa/quant_vnni.cpp
void linear_quant_i8(QuantType type, const QuantizedRows& x, const uint8_t* wp, const float* bias, float* y,
                     int64_t ldy, int64_t m, int64_t n, ThreadPool& pool);
}

}  // namespace ssd::kernels

/// `return <isa>::CALL;` for the active instruction set (avx512's copy for
/// avx512_vnni).
#if defined(SSD_X86_ISAS)
#define SSD_ON_ACTIVE_ISA(...)                                                    \
  switch (::ssd::kernels::active_isa()) {                                         \
    case ::ssd::kernels::Isa::avx512_vnni:                                        \
    case ::ssd::kernels::Isa::avx512: return ::ssd::kernels::avx512::__VA_ARGS__; \
    case ::ssd::kernels::Isa::avx2: return ::ssd::kernels::avx2::__VA_ARGS__;     \
    default: return ::ssd::kernels::portable::__VA_ARGS__;                        \
  }
#else
#define SSD_ON_ACTIVE_ISA(...) return ::ssd::kernels::portable::__VA_ARGS__;
#endif
