"""The adaptive policy's estimates, driven by hand (ssd._C.testing.PolicyHarness), and the auto fan-out budget.

The harness plays the engine around the policy without models: each step it
plans, reports a forward over the rows the verified rounds have (a forward
that costs `base + per_row * (rows - batch)` seconds), each round's outcome
(how many proposals were kept, and whether the tree hit or a fallback drafted
the round; a round can hit only after one that asked for a tree) and the
step's seconds. So each test sets exactly the timings and
outcomes the behaviour under test depends on:
- the n-gram fallback's proposals get their own acceptance estimate: rounds
  it drafted do not lower the draft model's;
- a forward the draft worker was busy beside does not time the forward curve;
- once the plan verifies nothing, the policy is in autoregressive steps and
  probes now and then (before: a trees kind verifying nothing never probed);
- a switch's first steps' excess over the model is the switch's cost;
- the step that times the forward of one row per sequence also measures
  what autoregressive steps cost beyond the model;
- that forward is timed again once the context has moved far from the one
  it was timed at, when autoregressive steps look best (for one step);
- hits have their own acceptance estimate (a hit's proposals are kept more
  often than the draft model's when it drafts a round);
- what steps cost beyond the model is learnt again at a new context;
- a speculative kind measured slower than autoregressive steps is left for
  them without waiting out the dwell;
- the n-gram fallback's proposals after a kept one are priced as kept on
  (its continuation's prior is not its first proposal's low odds);
- a probe of trees lasts two rounds of one sequence, so its second looks up a
  tree, and the first (a miss whatever the text) is not counted as a miss;
- a probe's steps (the draft catching up after autoregressive rounds) do not
  teach what a speculative kind's steps cost beyond the model;
- a step is compared with the model at its lookups as they fell, not at the
  mean hit rate;
- after the policy's own timing and warming plans, a speculative kind is
  taken only if it beats autoregressive steps by the hysteresis;
- the warm-up goes on until a step of the kind it warms was compared with
  the model;
- a batch that drains is priced from the larger batch's forwards, without
  timing steps while trees are in force and without a timing verify while
  autoregressive steps are, until it has stayed smaller for the dwell;
- a speculative kind is left for autoregressive steps only after their
  forward was timed at the context of the step (whichever rule leaves);
- drafting without trees is priced with a draft run over every sequence's
  round, not with a tree's misses' runs at the same batch;
- a speculative kind not measured at a batch is priced at least at another
  speculative kind's measured factor there.
The auto fan-out budget (ssd._C.testing.FanoutPlanner) moves only with a new
tree's measurement, is per sequence, shrinks in proportion to an overrun,
and reads a step-time fit through negative seconds at no rows as zero there.
Each test here fails against the code before these rules (checked by hand
with the old rules restored).
"""
import pytest

from ssd import _C

K = 4


def forward_seconds(rows, batch, per_row=0.002, base=0.1):
    return base + per_row * (rows - batch)


class Engine:
    """The engine's calls around the policy, at a fixed batch of `batch` sequences."""

    def __init__(self, batch, mode="ssd", prefill_rows=None, prefill_seconds=None, fallback="auto",
                 fallback_seconds=None, fallback_per_round=False):
        self.policy = _C.testing.PolicyHarness(mode, K, batch, fallback)
        self.batch = batch
        # fallback_seconds: a step with a missed round waits that long for the draft model's run, which the draft
        # side reports (None: misses cost nothing and nothing is reported; the model prices them at its prior).
        self.fallback_seconds = fallback_seconds
        self.fallback_per_round = fallback_per_round  # the run takes fallback_seconds per round it drafts
        self.totals = {"fallback_batches": 0, "fallback_seconds": 0.0,
                       "neural_fallback_batches": 0, "neural_fallback_seconds": 0.0}
        rows = batch if prefill_rows is None else prefill_rows
        seconds = forward_seconds(rows, batch) if prefill_seconds is None else prefill_seconds
        self.policy.observe_forward(rows, seconds)  # the prefill's last chunk
        for i in range(batch):
            self.policy.start(i)
        # Per sequence: its last round asked for a tree and speculated, so the draft built one beside it.
        self.tree_built = [False] * batch
        self.active = list(range(batch))  # the sequences still decoding

    def finish(self, i):
        """Sequence i finished: later steps' batches leave it out (a batch draining)."""
        self.policy.finish(i)
        self.active.remove(i)

    def step(self, kept, lookup_of_tree="hit", extra=None, context=0, forward=None, draft_totals=None,
             lookup_of=None):
        """One step. kept(lookahead, lookup): proposals kept; lookup_of_tree: what a round whose tree was built
        looks up (a round after one without a tree is drafted by the draft model, "neural", unless lookup_of_tree
        names a fallback); extra(lookaheads, trees): seconds the step waits more; context: every sequence's KV
        length (0: unchanged); forward(rows, context): the forward's seconds; draft_totals: the draft side's
        counters so far; lookup_of(i): what sequence i's round whose tree was built looks up (instead of
        lookup_of_tree)."""
        p, b = self.policy, len(self.active)
        if draft_totals is None and self.fallback_seconds is not None:
            draft_totals = dict(self.totals)
        p.plan(draft_totals or {}, context=context)
        # What this step verifies (planned a step ago), for the sequences still decoding.
        planned, planned_trees = p.lookaheads(), p.trees()
        lookaheads = [planned[i] for i in self.active]
        trees = [planned_trees[i] for i in self.active]
        self.verified_trees = trees  # of this step's rounds (p.trees(), after the step: of the next step's)
        rows = sum(1 + v for v in lookaheads)
        seconds = forward(rows, context) if forward else forward_seconds(rows, b)
        p.observe_forward(rows, seconds)
        missed = 0
        for i, v, tree in zip(self.active, lookaheads, trees):
            of_tree = lookup_of(i) if lookup_of else lookup_of_tree
            miss = "neural" if of_tree == "hit" else of_tree
            lookup = "none" if v == 0 else (of_tree if self.tree_built[i] else miss)
            p.after_round(i, v, kept(v, lookup), lookup)
            self.tree_built[i] = tree and v > 0
            missed += lookup in ("neural", "fast")
        if missed and self.fallback_seconds is not None:
            run = self.fallback_seconds * (missed if self.fallback_per_round else 1)
            seconds += run
            self.totals["fallback_batches"] += 1
            self.totals["fallback_seconds"] += run
            self.totals["neural_fallback_batches"] += 1
            self.totals["neural_fallback_seconds"] += run
        p.observe_step(seconds + (extra(lookaheads, trees) if extra else 0.0))
        return lookaheads

    def verified_kind(self, lookaheads):
        """What the step that verified `lookaheads` ran: "." autoregressive, "T" rounds with trees, "M" without."""
        return "." if not any(lookaheads) else "T" if any(self.verified_trees) else "M"

    def run(self, steps, kept, **kw):
        for _ in range(steps):
            self.step(kept, **kw)
        return self.policy.stats()


def every(v, lookup):
    return v


def none_kept(v, lookup):
    return 0


def test_fallback_proposals_do_not_lower_the_draft_models_estimate():
    p = _C.testing.PolicyHarness("ssd", K, 1)
    p.observe_forward(1, 0.1)
    p.start(0)
    # Rounds alternate: a hit whose four proposals (the draft model's) are all kept, a miss the
    # n-gram fallback drafted of which none is.
    for r in range(60):
        hit = r % 2 == 0
        p.after_round(0, K, K if hit else 0, "hit" if hit else "fast")
    p.plan()
    s = p.stats()
    # One estimate over both (the old one) would sit near 0.5. Hits have their own global estimate (30 hits, all
    # kept, against the prior 0.6 worth 8: over 0.9); the sequence's own (hits only, all kept) is pulled towards it.
    assert s["policy_hit_acceptance"] > 0.9
    # The model drafting a round was never measured: the sequence's own record pulled towards the prior 0.6.
    assert s["policy_acceptance"] > 0.75 and s["policy_continuation"] > 0.75
    # 30 fallback rounds, none kept, against the prior 0.3 worth 8: under 0.1.
    assert s["policy_fast_acceptance"] < 0.1


def draft_side(fast_s, neural_s):
    """DraftCounters totals after a fallback run of each kind per step: the n-gram kind's `fast_s`, the draft
    model's `neural_s`."""
    totals = {"fallback_batches": 0, "fallback_seconds": 0.0,
              "neural_fallback_batches": 0, "neural_fallback_seconds": 0.0}

    def grow():
        totals["fallback_batches"] += 2
        totals["fallback_seconds"] += fast_s + neural_s
        totals["neural_fallback_batches"] += 1
        totals["neural_fallback_seconds"] += neural_s
        return totals
    return grow


@pytest.mark.parametrize("neural_s, priced_s", [(0.011, 0.011), (0.1, 0.01)])
def test_a_trees_plan_is_priced_with_the_fallback_kind_that_makes_it_faster(neural_s, priced_s):
    """The worker's auto fallback serves a tree's misses with the n-gram kind (kept less often: its prior 0.3) or
    the draft model (the model's prior 0.6), whichever its speed model says is faster, and measures the one it
    tries. Priced at the mean of both kinds' runs, a tree's miss looked as slow as the draft model's runs even where
    the worker would serve it with the n-gram kind (the policy left trees at batch 2, where fixed ssd served misses
    with it and was 1.4x autoregressive steps). Here the n-gram run takes 10 ms: with the draft model's at 11 ms its
    proposals win; at 100 ms (most of a forward) the n-gram kind's speed does."""
    e = Engine(1)
    grow = draft_side(0.01, neural_s)
    for _ in range(10):
        e.step(every, draft_totals=grow())
    s = e.policy.stats()
    assert s["policy_fallback_seconds"] == pytest.approx(priced_s)


def test_hits_are_priced_with_what_hits_keep():
    """A hit follows text the draft foresaw, so a hit's proposals are kept far more often than the draft model's when
    it drafts a round from scratch (here every hit keeps all four, a re-drafted miss none). The trees kind's estimate
    weights hits by the hit rate, so it is well above drafting without trees; before, one estimate over both
    sources priced hits and misses the same."""
    p = _C.testing.PolicyHarness("ssd", K, 1)
    p.observe_forward(1, 0.1)
    p.start(0)
    for r in range(80):  # 3 of 4 rounds hit (all kept), the rest re-drafted by the model (none kept)
        hit = r % 4 != 0
        p.after_round(0, K, K if hit else 0, "hit" if hit else "neural")
    p.plan()
    s = p.stats()
    # 20 model rounds, none kept, against 0.6 worth 8; 60 hits, all kept. The sequence's own record (both sources)
    # pulls each towards 0.75, where one estimate over both would put both.
    assert s["policy_acceptance"] < 0.6
    assert s["policy_hit_acceptance"] > 0.78
    assert s["policy_hit_acceptance"] - s["policy_acceptance"] > 0.25


def test_the_n_gram_fallbacks_later_proposals_are_priced_as_kept_on():
    """The n-gram fallback copies a span of earlier text: its first proposal is often rejected, but once it is kept
    the rest of the span is too (fixed ssd kept 0.80-0.93 of them on greedy HumanEval and MT-bench). Here 30 trees
    hit, keeping two proposals of four; then 60 rounds are n-gram misses, of which one in three keeps all four and
    the rest none. A row costs a tenth of a one-row forward, so the fourth proposal pays only if the fallback's
    continuation is priced near what it is. With that prior at the first proposal's odds (0.3, worth 8 trials; its
    trials come only after a kept first proposal) the plan verified 3 of the 4 throughout."""
    e = Engine(1)
    grow = draft_side(0.004, 0.05)  # an n-gram run costs 4 ms, the draft model's 50
    fast_rounds = [0]

    def kept(v, lookup):
        if lookup != "fast":
            return min(v, 2)
        fast_rounds[0] += 1
        return v if fast_rounds[0] % 3 == 0 else 0

    forward = lambda rows, context: forward_seconds(rows, 1, per_row=0.01)
    verified = [e.step(kept, lookup_of_tree="hit" if i < 30 else "fast", forward=forward, draft_totals=grow())[0]
                for i in range(90)]
    s = e.policy.stats()
    assert s["policy_drafting"] == "trees" and s["adaptive_ar_steps"] <= 2
    assert s["policy_fast_acceptance"] < 0.35  # the first proposal: about one in three kept
    assert verified[-20:] == [K] * 20


def test_forwards_the_draft_worked_beside_do_not_time_the_forward():
    p = _C.testing.PolicyHarness("ssd", K, 4)
    p.observe_forward(4, 0.10)
    for _ in range(20):  # the draft busy for the whole forward (catching up): 3x slower
        p.observe_forward(4, 0.30, draft_busy=0.30)
    p.plan()
    assert p.stats()["policy_forward_seconds"] == pytest.approx(0.10)
    for _ in range(20):  # the draft busy for under a tenth of it: these time the forward
        p.observe_forward(4, 0.30, draft_busy=0.02)
    p.plan()
    assert p.stats()["policy_forward_seconds"] > 0.25


def test_probes_go_on_when_the_plan_verifies_nothing():
    engine = Engine(4)
    s = engine.run(100, every)  # every proposal kept, rows cheap: trees pay
    assert s["policy_drafting"] == "trees" and s["adaptive_tree_steps"] > 80
    probes = s["adaptive_probe_steps"]
    s = engine.run(400, none_kept)  # nothing kept any more: the plan shrinks to no proposal
    assert s["policy_drafting"] == "none"
    # Autoregressive steps probe after 64, then 128 more (then 256): the estimates stay alive.
    assert s["adaptive_probe_steps"] - probes >= 2


def test_a_probe_of_trees_looks_up_a_tree_and_its_first_round_is_no_miss():
    """A round can hit only if the round before it asked for a tree (the draft builds it beside that round's
    verify). Trees hit throughout, keeping every proposal; then nothing is kept, on hits too, and the plan leaves
    for autoregressive steps, which probe now and then. A probe's first round follows rounds without trees: a
    miss whatever the text. Before, a probe was that one round, so probes never looked up a tree, and it was
    counted as a miss: the hit rate learnt from probes only fell. Now a probe of trees is two rounds of one
    sequence, the second a lookup, and only that one is counted."""
    engine = Engine(1)
    forward = lambda rows, context: forward_seconds(rows, 1, per_row=0.02)  # four proposals: 1.8x one row
    engine.run(100, every, forward=forward)
    s = engine.policy.stats()
    assert s["policy_drafting"] == "trees" and s["policy_hit_rate"] > 0.8
    lookups = []
    kept = lambda v, lookup: lookups.append(lookup) or 0
    s = engine.run(300, kept, forward=forward)
    assert s["policy_drafting"] == "none" and s["adaptive_ar_steps"] > 250
    # The probes' second rounds hit (the hits before the plan left trees are the first few).
    assert "hit" in lookups[lookups.index("none"):]
    # The hit rate is as before: a probe's first round is no evidence of a miss.
    assert s["policy_hit_rate"] > 0.8


def test_autoregressive_steps_cost_beyond_the_forward_is_measured_from_the_timing_step():
    """Every step pays 0.06 s beyond its forward (the engine's own work: sampling, postprocess). The prefill timed a
    forward far from one row per sequence, so the policy's first plan times an autoregressive step; that step also
    measures what such steps cost beyond the model. Trees pay throughout and stay in force; autoregressive steps
    are then priced with their overhead, not as bare forwards (before: as bare forwards, 40 tok/s, which made a
    kind whose own overhead was measured look worse than autoregressive steps whose overhead was not)."""
    engine = Engine(4, prefill_rows=400)
    s = engine.run(60, lambda v, lookup: min(v, 2), extra=lambda lookaheads, trees: 0.06)
    assert s["policy_drafting"] == "trees" and s["adaptive_ar_steps"] <= 2
    bare = 4 / forward_seconds(4, 4)  # 40 tok/s
    assert s["policy_tok_s_ar"] < 0.9 * bare


def test_the_forward_is_timed_again_when_the_context_has_grown():
    """A row's cost grows with the context it attends to (here 30% per 100 tokens). The policy timed the forward of
    one row per sequence at context 30; the context then jumps to 300 (a warm-up on short prompts, then long ones).
    Trees keep paying at 300, but the forward timed at 30 prices autoregressive steps far too cheaply: without a new
    timing the policy switched to them and stayed the whole dwell (8 steps) before their measured steps brought it
    back. Now one autoregressive step times the forward at the new context and trees go on. A missed round waits
    for the draft model's run (0.1 s), so trees, which hit, are the faster speculative kind."""
    b = 4
    engine = Engine(b, prefill_rows=400, prefill_seconds=2.0, fallback_seconds=0.1)

    def forward(rows, context):
        return forward_seconds(rows, b) * (1 + 0.3 * context / 100)

    ar_steps_after = 0
    for n in range(90):
        lookaheads = engine.step(lambda v, lookup: min(v, 1), extra=lambda lookaheads, trees: 0.02 * any(lookaheads),
                                 context=30 + n if n < 30 else 300 + n, forward=forward)
        if n >= 30:
            ar_steps_after += not any(lookaheads)
    s = engine.policy.stats()
    assert s["policy_drafting"] in ("trees", "misses")
    assert ar_steps_after <= 3  # the timing step (and the step whose rounds it planned), not a dwell's worth
    # autoregressive steps priced at the new context: well under the 40 tok/s of a forward at context 30
    assert s["policy_tok_s_ar"] < 0.7 * 4 / forward_seconds(4, 4)


def test_a_batch_draining_on_trees_is_priced_from_the_larger_batchs_forwards():
    """Trees are in force at batch 4 when two sequences finish (speculation spreads the sequences' progress, so a
    batch drains unevenly). The forward of batch 2 was never timed: the policy timed it with an autoregressive step,
    then a verify without trees, and went back to trees, two switches and a fallback run for each size the tail
    passed (in the engine, 3-4 switches in the last second of a batch-4 run). Now the tail is priced from batch 4's
    forwards (one row per sequence flat below the smallest size timed, never cheaper) and every round of the two
    goes on with trees, until the batch has stayed smaller for the dwell."""
    e = Engine(4)
    e.run(30, every)
    before = e.policy.stats()
    assert before["policy_drafting"] == "trees"
    e.finish(2)
    e.finish(3)
    after = [(e.step(every), e.policy.trees()) for _ in range(6)]
    assert all(all(v > 0 for v in lookaheads) for lookaheads, _ in after)
    assert all(trees[0] and trees[1] for _, trees in after)
    s = e.policy.stats()
    assert s["policy_drafting"] == "trees" and s["policy_batch"] == 2
    assert s["adaptive_switches"] == before["adaptive_switches"]
    assert s["adaptive_ar_steps"] == before["adaptive_ar_steps"]
    # A batch that stays smaller (a server's load fell) is no tail: after the dwell its forward is timed.
    later = [e.step(every) for _ in range(6)]
    assert any(not any(lookaheads) for lookaheads in later)
    assert e.policy.stats()["adaptive_ar_steps"] > before["adaptive_ar_steps"]


def test_a_draining_batch_on_autoregressive_steps_times_no_verify_until_it_stays_smaller():
    """Nothing is kept, so autoregressive steps are in force at batch 4 when two sequences finish. Their forward at
    batch 2 is timed by an autoregressive step (free: it is the kind in force), but the verify of batch 2 was timed
    at once by a step drafting without trees, a draft run over the batch that a tail of a step or two never earns
    back (in the engine: MT-bench T 1 batch 8, the last sequences of the timed run). Now only once the batch has
    stayed smaller for the dwell."""
    e = Engine(4, fallback_seconds=0.05)
    e.run(30, none_kept)
    assert e.policy.stats()["policy_drafting"] == "none"
    e.finish(2)
    e.finish(3)
    kinds = ""
    for _ in range(14):
        lookaheads = e.step(none_kept)
        kinds += e.verified_kind(lookaheads)
    assert kinds.startswith("." * 8) and "M" in kinds


def test_a_speculative_kind_is_left_for_autoregressive_steps_only_after_timing_them_at_this_context():
    """The forward of one row per sequence was timed at context 30 (in the engine: the warm-up on 16-token prompts),
    then the context jumps to 300 (the timed run's prompts; a row costs 30 % more per 100 tokens), while warming
    rounds put trees in force. Trees are priced from forwards beside them at the new context, autoregressive steps
    from the one at 30, 1.7 times too cheap, and trees' own plan came to verify nothing: the policy left for
    autoregressive steps with no rule's check, and the dwell held them for 8 steps while trees were predicted 40 %
    ahead. Now it times that forward again first (one step), and stays on speculation."""
    b = 8
    engine = Engine(b, prefill_rows=400, prefill_seconds=2.0, fallback_seconds=0.05)

    def forward(rows, context):
        return forward_seconds(rows, b, per_row=0.005) * (1 + 0.3 * context / 100)

    ar = []
    for n in range(24):
        lookaheads = engine.step(lambda v, lookup: min(v, 1), context=30 + n if n < 3 else 300 + n, forward=forward)
        ar.append(not any(lookaheads))
    s = engine.policy.stats()
    assert s["policy_drafting"] != "none"
    # The first plan's timing step, and the step timing it again: not a dwell's worth.
    assert sum(ar) <= 3
    assert s["policy_tok_s_best"] > 1.1 * s["policy_tok_s_ar"]  # speculation is ahead, at the forward timed anew


def test_drafting_without_trees_is_priced_with_a_run_over_every_sequence():
    """At batch 8 one sequence's tree always misses and the draft model drafts its round (0.03 s a round); the
    others hit, and a hit's proposals are never kept while the draft model's are. Drafting without trees looks
    better, but there the draft model drafts all 8 rounds (0.24 s a step). Priced with the misses' runs (one round
    each) at this batch, the policy took it twice, for 6-7 steps each, and the measured steps sent it back.
    Priced with a run over the batch's rounds (from runs of one round and the timing verify's run of 8), trees
    stay in force; with 0.01 s a round drafting without trees does win, and is taken."""
    def path(per_round):
        e = Engine(8, fallback_seconds=per_round, fallback_per_round=True)
        kinds = ""
        for _ in range(40):
            lookaheads = e.step(lambda v, lookup: v if lookup == "neural" else 0,
                                lookup_of=lambda i: "neural" if i == 0 else "hit")
            kinds += e.verified_kind(lookaheads)
        return kinds

    assert "M" not in path(0.03)[2:]  # after the timing verify (drafted without trees)
    assert path(0.01).endswith("M" * 10)


def test_a_speculative_kind_not_measured_at_a_batch_is_not_priced_below_one_that_was():
    """At batch 8 two of four proposals are kept, but every speculative step waits 1.5 of its forward more (the
    draft side cannot keep up), which only measured steps show. Trees were measured slow and left for
    autoregressive steps; drafting without trees, never measured here, was priced at autoregressive steps'
    factor, taken after the dwell, and run for 5 steps before its own steps sent the policy back. Now a
    speculative kind not measured at a batch is priced at least at another's measured factor there, and is not
    taken. (The price of the rule: where drafting without trees would in fact pay less of the wait, as here with
    a wait of 0.3 of a forward, it is not found either.)"""
    b = 8
    engine = Engine(b, prefill_rows=400, prefill_seconds=2.0)

    def wait(lookaheads, trees):
        return 1.5 * forward_seconds(sum(1 + v for v in lookaheads), b) if any(lookaheads) else 0.0

    kinds = ""
    for _ in range(40):
        lookaheads = engine.step(lambda v, lookup: min(v, 2), extra=wait)
        kinds += engine.verified_kind(lookaheads)
    assert "TTT" in kinds and kinds.endswith("." * 10)
    assert "M" not in kinds[kinds.index("TTT"):]  # after the timing steps (a verify drafted without trees)


def test_what_steps_cost_beyond_the_model_is_learnt_again_at_a_new_context():
    """Tree steps wait half a forward more at context 30 (a warm-up on short prompts: the draft's trees are long
    against the short forwards) and none at context 300. Every proposal is kept and a missed round waits 0.2 s for
    the draft model, so trees stay in force throughout. A step whose rounds hit is modelled as its verify, so the
    measured / modelled factor is learnt near 1.5 at context 30, and is 1.0 at 300. Measurements at 300 replace
    what was learnt at 30; before, the factor was a decayed mean over both (above 1.3 after three steps at 300),
    which went on pricing trees as at 30 for a dozen steps."""
    b = 4
    engine = Engine(b, prefill_rows=400, prefill_seconds=2.0, fallback_seconds=0.2)

    def tree_wait(wait):  # a tree step waits `wait` of its forward more
        return lambda lookaheads, trees: (wait * forward_seconds(sum(1 + v for v in lookaheads), b)
                                          if any(trees) and any(lookaheads) else 0.0)

    for n in range(40):
        engine.step(every, extra=tree_wait(0.5), context=30 + n)
    s = engine.policy.stats()
    assert s["policy_drafting"] == "trees" and s["policy_step_factor"] > 1.3
    for n in range(3):
        engine.step(every, extra=tree_wait(0.0), context=300 + n)
    s = engine.policy.stats()
    assert s["policy_drafting"] == "trees" and s["policy_step_factor"] < 1.1


def test_a_speculative_kind_measured_slower_than_autoregressive_steps_is_left_before_the_dwell():
    """At batch 8 two of four proposals are kept, so the model prices speculative steps above autoregressive ones;
    but every speculative step waits 1.5 of its forward more (the draft side cannot keep up at this batch), which
    only measured steps show. Before, each speculative kind the policy tried stayed in force for the dwell (8
    steps): trees, then drafting without trees, 16 slow steps. Now a speculative kind is left for autoregressive
    steps once two of its steps were compared with the model (after its two switch steps)."""
    b = 8
    engine = Engine(b, prefill_rows=400, prefill_seconds=2.0)

    def wait(lookaheads, trees):
        return 1.5 * forward_seconds(sum(1 + v for v in lookaheads), b) if any(lookaheads) else 0.0

    speculative = [any(engine.step(lambda v, lookup: min(v, 2), extra=wait)) for _ in range(60)]
    s = engine.policy.stats()
    assert s["policy_drafting"] == "none" and s["adaptive_tree_steps"] >= 3  # trees were tried, and left
    # After the timing steps each kind tried is left within 5 steps (its two switch steps, two compared, the
    # step planned before leaving): 8 or more with the dwell. Probes are runs of two steps.
    runs = "".join("s" if x else "." for x in speculative[3:]).split(".")
    assert 0 < max(len(r) for r in runs) <= 5


def switch_cost(stall):
    """Trees pay while they hit; then every miss is drafted by the n-gram fallback (configured "fast"), whose proposals are never
    kept while the draft model's all still are: drafting without trees (misses) wins, and the policy switches.
    The switch's first two steps wait `stall` seconds more. Returns the switch cost the policy then reports."""
    engine = Engine(4, fallback="fast")
    s = engine.run(100, every)
    assert s["policy_drafting"] == "trees"
    switches = s["adaptive_switches"]
    ran = []  # per step: it verified rounds drafted without trees

    def stalled(lookaheads, trees):
        ran.append(any(v > 0 and not t for v, t in zip(lookaheads, trees)))
        first = ran[-1] and (len(ran) < 3 or not all(ran[-3:-1]))  # one of the first two such steps
        return stall if first else 0.0

    s = engine.run(200, lambda v, lookup: 0 if lookup == "fast" else v, lookup_of_tree="fast", extra=stalled)
    assert s["policy_drafting"] == "misses" and s["adaptive_switches"] > switches
    assert sum(ran) > 100
    return s["policy_switch_seconds"]


def test_a_switchs_stalled_first_steps_raise_its_cost():
    cheap, stalled = switch_cost(0.0), switch_cost(2.0)
    assert stalled > 1.2 * cheap


# ---- the auto fan-out budget (branches per sequence, sized to the verify) ----

def planner():
    return _C.testing.FanoutPlanner(4, [], 0, 64)  # budget 0: auto, from k + 1 = 5


def test_budget_moves_only_with_a_new_tree():
    p = planner()
    p.observe_round(0.0, 0.05, 0.10, sequences=1)  # a tree of 1 sequence at budget 5, half its verify
    p.plan(1)
    assert p.budget == 6  # one branch more
    for _ in range(10):  # draft batches without a tree (no sequence speculates): nothing measured
        p.plan(1)
    assert p.budget == 6


def test_budget_is_per_sequence():
    p = planner()
    for _ in range(11):  # trees of 1 sequence under their verify: 5 -> 16 branches
        p.observe_round(0.0, 0.05, 0.10, sequences=1)
        p.plan(1)
    assert p.budget == 16
    # The next tree is for 16 sequences: the 16 branches the last tree of one had, over 16.
    p.plan(16)
    assert p.budget == 1


def test_budget_shrinks_in_proportion_when_a_tree_overruns():
    p = planner()
    p.plan(16)
    for _ in range(11):  # trees of 16 sequences under their verify: one branch more each, 5 -> 16
        p.observe_round(0.0, 0.05, 0.10, sequences=16)
        p.plan(16)
    assert p.budget == 16
    # 256 branches took 7x the verify: 256 * 0.95 / 7 = 34.7 branches next, 2 per sequence (not 15).
    p.observe_round(0.0, 0.70, 0.10, sequences=16)
    p.plan(16)
    assert p.budget == 2


def test_budget_from_a_fit_through_negative_seconds():
    # Tree steps of 10 rows took 0.05 s and of 20 rows 0.15 s: 0.01 s a row, -0.05 s at none (taken as 0).
    p = planner()
    for rows, seconds in [(10, 0.05), (20, 0.15)] * 3:
        p.observe_tree_step(rows, seconds)
    p.observe_round(0.01, 0.2, 1.0, sequences=2)
    p.plan(2)
    rows = ((0.95 * 1.0 - 0.01) / 4 - 0.0) / 0.01  # fork + k (alpha + beta rows) <= 0.95 verify
    assert p.budget == int(rows // 2)


def test_a_probes_steps_do_not_price_the_kind_it_probes():
    """The first speculative round after autoregressive ones waits for the draft to catch up (here three forwards'
    time), which a switch's first steps pay, and so does a probe. Trees keep two proposals a round, then none for
    a while (the plan leaves for autoregressive steps), then two again. Before, a probe's steps were compared with
    the model like any step of trees: the catch-up raised the factor trees are priced with, each probe confirming
    the last, and the plan never went back to trees (400 steps, 4 probe steps). Now a probe measures acceptance
    only, and its kept proposals bring trees back, priced as before they were left."""
    engine = Engine(1)
    forward = lambda rows, context: forward_seconds(rows, 1, per_row=0.02)
    previous = {"speculated": True}

    def catch_up(lookaheads, trees):
        speculated = any(lookaheads)
        wait = 0.3 if speculated and not previous["speculated"] else 0.0
        previous["speculated"] = speculated
        return wait

    two_kept = lambda v, lookup: min(v, 2)
    s = engine.run(100, two_kept, forward=forward, extra=catch_up)
    assert s["policy_drafting"] == "trees"
    factor = s["policy_step_factor"]
    s = engine.run(40, none_kept, forward=forward, extra=catch_up)
    assert s["policy_drafting"] == "none"
    s = engine.run(250, two_kept, forward=forward, extra=catch_up)  # probes after 64 and 128 more steps
    assert s["policy_drafting"] == "trees" and s["adaptive_probe_steps"] >= 1
    assert s["policy_step_factor"] == pytest.approx(factor, rel=0.02)


def test_a_steps_lookups_as_they_fell_price_it_not_the_mean_hit_rate():
    """A step whose rounds missed waits for the draft model's run; one whose rounds hit does not. Before, every
    tree step was modelled at the mean hit rate, so a step that missed measured far above the model and one that
    hit below it (1.3 and 1.05 at batch 1, HumanEval T 1), and a few misses in a row raised the factor trees are
    priced with, which left trees for autoregressive steps. Now a step is modelled with its lookups as they fell:
    the factor is the model's error in costs (none here), whatever the luck."""
    engine = Engine(1, fallback_seconds=0.05)
    forward = lambda rows, context: forward_seconds(rows, 1, per_row=0.02)
    engine.run(40, every, forward=forward)
    s = engine.policy.stats()
    assert s["policy_drafting"] == "trees" and s["policy_hit_rate"] > 0.8
    factors = []
    for _ in range(6):  # six misses in a row, served by the draft model
        engine.step(every, lookup_of_tree="neural", forward=forward)
        factors.append(engine.policy.stats()["policy_step_factor"])
    assert max(factors) == pytest.approx(1.0, abs=0.02)
    s = engine.policy.stats()
    assert s["policy_drafting"] == "trees"


def test_after_warming_a_speculative_kind_needs_the_hysteresis_over_autoregressive_steps():
    """At batch 8 one proposal of four is kept: after the warming rounds (every proposal, two steps here) trees are
    predicted 2-3 % above autoregressive steps. The plan after warming or timing took the best kind outright, so a
    prediction inside the model's error switched to trees (in the engine, at the start of a run at batch 8, where
    trees were measured far slower a few steps later). Now it takes a speculative kind only by the hysteresis."""
    e = Engine(8, fallback_seconds=0.05)
    forward = lambda rows, context: forward_seconds(rows, 8, per_row=0.007)
    edges = []
    for _ in range(20):
        e.step(lambda v, lookup: min(v, 1), forward=forward)
        s = e.policy.stats()
        edges.append(s["policy_tok_s_best"] / s["policy_tok_s_ar"])
    assert 1.0 < max(edges[2:]) < 1.05  # the premise: trees a little above autoregressive steps
    # The warming steps only (until a step of trees was compared with the model).
    assert s["policy_drafting"] == "none" and s["adaptive_tree_steps"] <= 4


def test_the_warm_up_goes_on_until_a_step_of_the_kind_it_warms_was_compared():
    """At batch 8 the warm-up's sixteen trials took two steps (a verify timed, then one of trees), both a switch's
    first steps, which are not compared with the model: trees' step factor at this batch stayed unmeasured,
    priced at autoregressive steps' factor, and a later plan (in the engine, the timed run's first) switched to
    trees whose steps took three times an autoregressive step's (0.5-0.6 s against 0.17 s), for 3-5 steps
    (HumanEval and MT-bench T 1, batch 8: 0.91x and 0.94x ar). Now the warm-up goes on until a step of the kind
    it warms was compared with the model: here trees steps wait a forward more than the model says, and after
    the warm-up they are priced below autoregressive steps; without the wait they stay priced above them."""
    def warm_up(tree_wait):
        e = Engine(8, fallback_seconds=0.05)
        forward = lambda rows, context: forward_seconds(rows, 8, per_row=0.007)

        def wait(lookaheads, trees):
            slow = any(v > 0 and t for v, t in zip(lookaheads, trees))
            return tree_wait * forward(sum(1 + v for v in lookaheads), 0) if slow else 0.0

        s = e.run(12, lambda v, lookup: min(v, 1), forward=forward, extra=wait)
        return s, s["policy_tok_s_best"] / s["policy_tok_s_ar"]

    s, edge = warm_up(0.0)
    assert s["policy_drafting"] == "none" and 1.0 < edge < 1.05  # the premise: trees just above, within hysteresis
    s, edge = warm_up(1.0)
    assert s["adaptive_tree_steps"] >= 3  # two switch steps and a compared one
    assert s["policy_drafting"] == "none" and edge == 1.0  # the best kind is autoregressive steps
