// The instruction set this translation unit is compiled for. CMakeLists.txt
// compiles each file of this folder three times with SSD_ISA_LEVEL 0, 1 and 2
// and the matching instruction-set flags; SSD_ISA names the namespace the code lands in, so
// the three copies link side by side (isa.h picks one at run time).
#pragma once

#if !defined(SSD_ISA_LEVEL)
#error "kernels/cpu/isa is compiled once per instruction set: set SSD_ISA_LEVEL (see CMakeLists.txt)"
#elif SSD_ISA_LEVEL == 2
#if !(defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
      defined(__FMA__))
#error "SSD_ISA_LEVEL 2 is compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma"
#endif
#define SSD_ISA avx512
#elif SSD_ISA_LEVEL == 1
#if !(defined(__AVX2__) && defined(__FMA__))
#error "SSD_ISA_LEVEL 1 is compiled with -mavx2 -mfma"
#endif
#define SSD_ISA avx2
#elif SSD_ISA_LEVEL == 0
#define SSD_ISA portable
#else
#error "SSD_ISA_LEVEL is 0 (portable), 1 (avx2) or 2 (avx512)"
#endif
