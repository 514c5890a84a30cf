// The target's side of a step, on the target's device: the forward's logits
// stay where the forward left them; the token after a prefill, the
// verification of each speculative chunk and the log-probabilities a request
// asked for are computed there by the backend's round steps (backend.h), and
// what is read back to the host per sequence is its accepted count and its
// tokens, plus the asked-for log-probabilities. The same code runs on every
// backend: on the CPU (the cpu backend, or the aten backend standing in for a
// device) the steps are the CPU kernels.
//
// The laws are those of kernels/cpu: under the rejection coupling one verify
// step draws every chunk (a chunk without proposals is a plain draw of its
// row with the kSample uniform); under the Gumbel coupling every row's token
// is the Gumbel-max draw of its processed distribution at its position, and a
// proposal is accepted while it equals the target's token there.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../model/backend.h"
#include "coupling.h"
#include "device_io.h"
#include "scheduler.h"
#include "speculator.h"
#include "ssd/config.h"
#include "ssd/types.h"
#include "verification.h"

namespace ssd::runtime {

/// One chunk of the forward whose rows the round reads.
struct RoundItem {
  const Sequence* seq = nullptr;
  /// The chunk's proposals (their first at position seq->len()); null: a
  /// prefill's last row, whose token is drawn at position seq->len().
  const Proposal* proposal = nullptr;
  int64_t first_row = 0;  ///< the chunk's first row in the forward's logits
};

struct RoundOutcome {
  Verdict verdict;                      ///< a drawn token: accepted 0, bonus = the token
  std::string error;                    ///< non-empty: the item failed (NaN logits)
  std::vector<TokenLogprobs> logprobs;  ///< when asked: one per emitted token (accepted run, then bonus)
};

class TargetRound {
 public:
  /// TestingConfig's deliberate faults of verification (fault_resume_stream,
  /// fault_batch_top_kp, fault_fast_argmax, fault_peek_target, and the
  /// coupling's fault_shared_noise) apply here; without them the round is the
  /// laws above.
  TargetRound(const model::Backend& backend, int64_t vocab, const TestingConfig& testing, const Coupling& coupling);

  /// logits: [rows, vocab] f32 on the backend's device, the items' rows in
  /// item order (NaNs are zeroed in place); one outcome per item.
  std::vector<RoundOutcome> run(const at::Tensor& logits, const std::vector<RoundItem>& items);

  /// Bytes the rounds have read from the device to the host so far.
  int64_t host_bytes() const { return reads_.bytes(); }

 private:
  struct Row;  // one item's settings and proposals as verified

  Row prepare(const RoundItem& item);
  /// Rows of the forward that belong to `item` (its proposals' and the one after).
  static int64_t item_rows(const RoundItem& item);
  /// accepted [B] then bonus [B] of one verify step, on the device.
  at::Tensor draw_rejection(const at::Tensor& logits, const std::vector<Row>& rows);
  /// The rows' q [B, k, vocab] on the target's device (zero past each row's proposals).
  at::Tensor gather_q(const std::vector<Row>& rows, int64_t k) const;
  /// The target's Gumbel-max draw of every row of the forward [rows], on the device.
  at::Tensor draw_gumbel(const at::Tensor& logits, const std::vector<Row>& rows);
  void report_logprobs(const at::Tensor& logits, const std::vector<RoundItem>& items, std::vector<RoundOutcome>& out);
  /// The proposals fault_peek_target keeps: those whose p(x) >= q(x).
  int64_t peek(const at::Tensor& logits, const RoundItem& item, const SamplingParams& params);
  template <class T>
  at::Tensor upload(const std::vector<T>& values, at::ScalarType dtype) const {
    return runtime::upload(backend_, values, dtype);
  }
  at::Tensor read(const at::Tensor& t) { return reads_.read(t); }

  const model::Backend& backend_;
  int64_t vocab_;
  TestingConfig testing_;
  Coupling coupling_;
  HostReads reads_;
  bool has_first_ = false;  // fault_batch_top_kp: the first request's settings are taken
  SamplingParams first_;
};

}  // namespace ssd::runtime
