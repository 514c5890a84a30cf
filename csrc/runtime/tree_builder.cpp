#include "tree_builder.h"

#include <algorithm>
#include <chrono>

#include "coupling.h"
#include "ssd/log.h"

namespace ssd::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TreeBuilder::TreeBuilder(const EngineConfig& config, model::KvCache& kv, PathDecoder& decoder,
                         FanoutPlanner& planner)
    : K_(config.k),
      confidence_(confidence_fanout(config)),
      gumbel_(gumbel_coupling(config)),
      kv_(kv),
      decoder_(decoder),
      planner_(planner) {}

bool TreeBuilder::confidence_ranked(const DraftSequence& s) const { return confidence_ && (s.greedy() || gumbel_); }

int64_t TreeBuilder::verified(const DraftSequence& s) const {
  return std::clamp<int64_t>(s.verify, 0, std::min<int64_t>(K_, static_cast<int64_t>(s.spec.size())));
}

int64_t TreeBuilder::last_fork(const DraftSequence& s, int64_t fork_end) const {
  const int64_t V = verified(s);
  return V < K_ ? V : fork_end;
}

void TreeBuilder::observe_outcome(const DraftSequence& s, int64_t accepted, int64_t proposed, int32_t bonus) {
  const auto drafted = static_cast<int64_t>(s.spec.size());
  int64_t rank = 0, listed = 0;  // rank 0: the bonus was not listed
  if (accepted < static_cast<int64_t>(s.ranked.size())) {
    for (int32_t t : s.ranked[accepted].tokens) {
      if (accepted < proposed && accepted < drafted && t == s.spec[accepted]) continue;  // never a candidate
      ++listed;
      if (t == bonus && rank == 0) rank = listed;
    }
  }
  planner_.observe_outcome(accepted, proposed, rank, listed);
  if (!confidence_ranked(s)) return;
  // Calibration of the confidence fan-out: the proposals verified this round
  // (the accepted ones and the rejected one after them) by the draft's
  // probability of them.
  const int64_t last = std::min<int64_t>({accepted, proposed - 1, drafted - 1});
  for (int64_t i = 0; i <= last; ++i) {
    if (i >= static_cast<int64_t>(s.ranked.size()) || s.ranked[i].probs.empty()) break;
    planner_.observe_proposal(s.ranked[i].prob_of(s.spec[i]), i < accepted);
  }
}

TreeReport TreeBuilder::build(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout,
                              double verify_seconds) {
  const auto t0 = Clock::now();
  TreeReport report;
  report.sequences = static_cast<int64_t>(seqs.size());
  report.per_fork.assign(static_cast<size_t>(K_ + 1), 0);
  // Without branches at K (F_K = 0) the last proposal need not be fed yet.
  const int64_t fork_end = fanout[K_] > 0 || confidence_ ? K_ : K_ - 1;
  score_forks(seqs, fanout, fork_end);
  report.fork_seconds = since(t0);

  bool room = true;
  for (DraftSequence* s : seqs) {
    const std::vector<Candidate> chosen = candidates(*s, fanout);
    report.planned += static_cast<int64_t>(chosen.size());
    // Out of tree blocks: the trees stay partial (no branch for later candidates).
    for (const Candidate& c : chosen) {
      room = room && add_branch(*s, c);
      if (room) report.per_fork[c.first] += 1;
    }
  }
  decode_branches(seqs, fanout, report);
  report.seconds = since(t0);
  planner_.observe_round(report.fork_seconds, report.branch_seconds,
                         verify_seconds > 0 ? verify_seconds : report.seconds, report.sequences);
  if (report.branches < report.planned)
    SSD_LOG_INFO("ssd tree: out of draft KV blocks, " << report.branches << " of " << report.planned
                                                      << " planned branches allocated (" << report.sequences
                                                      << " sequences)");
  return report;
}

void TreeBuilder::score_forks(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout,
                              int64_t fork_end) {
  // Fork point j's distribution is the row of position L - 1 + j: fed the
  // last committed token, then the proposals.
  // A round verifying V < K proposals has its last fork point at V.
  std::vector<DraftPath> score;
  for (DraftSequence* s : seqs) {
    const auto L = static_cast<int64_t>(s->tokens.size());
    const int64_t end = last_fork(*s, fork_end);
    if (s->computed >= L + end) continue;
    std::vector<int32_t> feed;
    for (int64_t pos = s->computed; pos < L + end; ++pos)
      feed.push_back(pos < L ? s->tokens[pos] : s->spec[pos - L]);
    score.push_back(DraftPath::scoring(*s, s->table, s->computed, std::move(feed), L - 1));
  }
  decoder_.decode(score, fanout, DraftForwards::kForkScoring);
  for (DraftPath& p : score) {
    DraftSequence* s = p.seq;
    const auto L = static_cast<int64_t>(s->tokens.size());
    const int64_t first = std::max(p.pos0, p.rank_from);
    for (size_t r = 0; r < p.fed_ranked.size(); ++r) {
      const int64_t j = first + static_cast<int64_t>(r) - (L - 1);
      if (j >= 0 && j <= K_ && s->ranked[j].empty()) s->ranked[j] = std::move(p.fed_ranked[r]);
    }
    s->computed = std::max(s->computed, L + last_fork(*s, fork_end));
  }
}

std::vector<TreeBuilder::Candidate> TreeBuilder::candidates(const DraftSequence& s,
                                                            const std::vector<int64_t>& fanout) const {
  // Until enough proposals calibrate it, the confidence fan-out plans like the geometric one.
  if (confidence_ranked(s) && planner_.proposals_observed() >= FanoutPlanner::kCalibrated)
    return confidence_candidates(s);
  // Fork points past the verified proposals cannot happen; at the last
  // verified one (V) every token can, x_{V+1} too when V < K.
  const int64_t V = verified(s);
  std::vector<Candidate> chosen;
  for (int64_t j = 0; j <= V; ++j) {
    int64_t taken = 0;
    for (int32_t c : s.ranked[j].tokens) {
      if (taken >= fanout[j]) break;
      if (j < V && c == s.spec[j]) continue;
      ++taken;
      chosen.emplace_back(j, c);
    }
  }
  return chosen;
}

std::vector<TreeBuilder::Candidate> TreeBuilder::confidence_candidates(const DraftSequence& s) const {
  const int64_t V = verified(s);
  std::vector<ForkPoint> forks(static_cast<size_t>(V + 1));
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(V + 1));
  for (int64_t j = 0; j <= V; ++j) {
    const RankedTokens& r = s.ranked[j];
    for (size_t i = 0; i < r.tokens.size() && i < r.probs.size(); ++i) {
      if (j < V && r.tokens[i] == s.spec[j]) {
        forks[j].proposed_prob = r.probs[i];
        continue;
      }
      forks[j].candidates.push_back(r.probs[i]);
      tokens[j].push_back(r.tokens[i]);
    }
  }
  const auto best = confidence_branches(forks, planner_.budget(),
                                        [this](double p) { return planner_.proposal_acceptance(p); });
  std::vector<Candidate> chosen;
  for (const auto& [j, index] : best) chosen.emplace_back(j, tokens[j][index]);
  return chosen;
}

bool TreeBuilder::add_branch(DraftSequence& s, const Candidate& candidate) {
  // The branch borrows the sequence's full blocks before its fork position P
  // and grows by K positions from P in blocks of its own. Its forwards read
  // the keys below P through the sequence's table (fork attention), so the
  // partial block at P is never copied.
  const int64_t bs = kv_.block_size();
  const int64_t P = static_cast<int64_t>(s.tokens.size()) + candidate.first;
  TreeBranch b;
  b.fork = candidate.first;
  b.bonus = candidate.second;
  b.shared = P / bs;
  b.table.blocks.assign(s.table.blocks.begin(), s.table.blocks.begin() + b.shared);
  if (!kv_.reserve(b.table, P + K_)) return false;  // reserve changed nothing
  s.branches.push_back(std::move(b));
  return true;
}

void TreeBuilder::decode_branches(const std::vector<DraftSequence*>& seqs, const std::vector<int64_t>& fanout,
                                  TreeReport& report) {
  std::vector<DraftPath> paths;
  for (DraftSequence* s : seqs)
    for (TreeBranch& b : s->branches)
      paths.push_back(
          DraftPath::branch(*s, s->table, b.table, static_cast<int64_t>(s->tokens.size()) + b.fork, {b.bonus}, K_));
  const auto t0 = Clock::now();
  decoder_.decode(paths, fanout, DraftForwards::kBranches);
  report.branch_seconds = since(t0);
  report.branches = static_cast<int64_t>(paths.size());
  size_t next = 0;
  for (DraftSequence* s : seqs) {
    for (size_t bi = 0; bi < s->branches.size(); ++bi, ++next) {
      DraftPath& p = paths[next];
      CachedSpeculation e;
      e.tokens = std::move(p.out);
      e.q = std::move(p.q);
      e.ranked = std::move(p.ranked);
      e.branch = bi;
      s->cache.emplace(std::make_pair(s->branches[bi].fork, s->branches[bi].bonus), std::move(e));
    }
    s->treed = true;
  }
}

}  // namespace ssd::runtime
