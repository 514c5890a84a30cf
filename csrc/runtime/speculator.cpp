#include "speculator.h"

#include "sd_speculator.h"
#include "ssd_speculator.h"

namespace ssd::runtime {

std::unique_ptr<Speculator> make_speculator(const EngineConfig& config, const TestingConfig& testing,
                                            std::shared_ptr<model::Model> draft) {
  if (config.mode == "sd") return std::make_unique<SdSpeculator>(config, std::move(draft));
  if (config.mode == "ssd") return std::make_unique<SsdSpeculator>(config, testing, std::move(draft));
  return nullptr;
}

}  // namespace ssd::runtime
