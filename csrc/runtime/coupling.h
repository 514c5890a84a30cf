// How a round couples the draft's proposals with the target's draws
// (EngineConfig::coupling):
// - "rejection": the draft samples with its own uniforms; the target accepts
//   x with probability min(1, p(x) / q(x)) and draws the bonus from the
//   residual. Lossless, but which sample comes out depends on the proposals.
// - "gumbel": every draw at a position is the Gumbel-max draw under noise
//   keyed by (seed, position, token) (kernels/cpu/gumbel.h): the target's
//   token is argmax p / E, the draft proposes argmax q / E, and a proposal is
//   accepted exactly when it is the target's token. The output is the
//   autoregressive sample itself, whatever the draft proposed.
#pragma once

#include <cstdint>

#include "ssd/config.h"

namespace ssd::runtime {

/// Whether `config` couples draws by shared Gumbel noise.
inline bool gumbel_coupling(const EngineConfig& config) { return config.coupling == "gumbel"; }

struct Coupling {
  bool gumbel = false;
  /// TestingConfig::fault_shared_noise: every position draws with the noise
  /// of position 0, which correlates a request's tokens (a wrong law).
  bool fault_shared_noise = false;

  static Coupling of(const EngineConfig& config, const TestingConfig& testing) {
    return {gumbel_coupling(config), testing.fault_shared_noise};
  }
  /// The position whose noise the target's draw at `position` uses.
  uint64_t noise_position(int64_t position) const {
    return fault_shared_noise ? 0 : static_cast<uint64_t>(position);
  }
};

}  // namespace ssd::runtime
