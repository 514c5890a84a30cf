"""``python -m ssd.bench``: AR, SD and SSD side by side on real prompts, the speed model checked.

This is the default run; ``python -m ssd.bench --help`` lists the other
benchmarks (``decode``, ``fallback``, the kernel scripts).

The default pair is CONSTRUCTED (``ssd.testing.regime_pair``: draft =
SmolLM2-135M-Instruct as shipped, target = the same model with ballast and
perturbing layers; it claims nothing about any published model). ``--target``
and ``--draft`` run any other pair.

Measured per run (a mode at one dataset, batch size and temperature):

* decode tok/s: generated tokens minus each request's first, over the time
  from the first token to the last (prefill excluded), summed over the groups
  of ``batch`` requests that run together;
* end-to-end tok/s (all tokens over wall time) and mean time to first token;
* the engine's own metrics over the run's requests only (counter deltas fed to
  ``ssd._C.speed_metrics``, the one definition): acceptance rate, mean
  accepted length, cache hit rate, E_hit, E_miss, T_p, T_b, target busy
  fraction, fallback counts.

Predicted per run, from component times measured IN ISOLATION at the run's
batch size and mean context (``ssd._C.SequenceRunner``, the placement's
threads), never from the run's round times, by the speed model
``ssd._C.predict_round`` (csrc/include/ssd/speed_model.h), in units of one
verify forward with verify_cost = t_verify(B) / t_ar(B):

* ar:  B / t_ar(B)
* sd:  sequential rounds, E = tokens_per_round, T_p = K t_d(B) / t_verify(B)
* ssd: overlapped rounds with p the hit rate, E_hit, E_miss,
  T_p = (t_fork(B) + K t_tree(rows)) / t_verify(B) (fork-point forward and K
  tree steps over the run's mean branch rows) and T_b = (neural share) K
  t_d(B) / t_verify(B); a round with a miss costs max(1, T_p) + T_b.

Placement: in every mode the target gets ``--target-threads`` (default 1);
``sd`` runs its draft on the target's threads (the two take turns), ``ssd``
gives the draft worker its own ``--draft-threads`` (the machine's other core),
as the paper gives the draft its own GPU. "same total hardware" rows rerun
``ar`` and ``sd`` with target_threads = target + draft threads.

Regime sweeps: ``--regime-acceptance 0.5,0.6,0.7`` (or ``--regime-cost-ratio
0.1,0.2,0.3``; one of the two at a time, constructed pairs only) runs all of
the above on each constructed pair (built once, then cached). Every run
records its pair's requested acceptance and cost ratio and measured
agreement; the document's ``"sweep"`` lists, per value and dataset (batch,
temperature), SSD over SD and over max(AR, SD) on the target's own hardware,
measured and predicted, and ``--plots`` adds ``sweep_<parameter>.png``.
"""
from __future__ import annotations

from .core import BenchConfig, run_bench, run_pair, sweep_summary

__all__ = ["BenchConfig", "run_bench", "run_pair", "sweep_summary"]
