"""Statistics for output-law tests: G-test and the sample size that gives it power."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats


def g_test(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of the G-test of observed counts against exact probabilities.

    Categories with probability 0 must have no counts (returns 0.0 otherwise).
    """
    counts = np.asarray(counts, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    n = counts.sum()
    obs, exp = counts[support], probs[support] * n
    nz = obs > 0
    g = 2.0 * np.sum(obs[nz] * np.log(obs[nz] / exp[nz]))
    dof = max(int(support.sum()) - 1, 1)
    return float(stats.chi2.sf(g, dof))


def samples_for_power(probs: np.ndarray, tv: float = 0.01, alpha: float = 0.01, power: float = 0.9) -> int:
    """Samples needed so that the least detectable law at total-variation `tv`
    from `probs` is rejected with probability `power` at level `alpha`.

    The hardest perturbation of a given TV moves mass tv between the two most
    likely outcomes; its noncentrality per sample is tv^2 (1/p1 + 1/p2).
    """
    p = np.sort(np.asarray(probs, dtype=np.float64)[np.asarray(probs) > 0])[::-1]
    dof = max(len(p) - 1, 1)
    per_sample = tv * tv * (1.0 / p[0] + 1.0 / (p[1] if len(p) > 1 else p[0]))
    crit = stats.chi2.isf(alpha, dof)
    lo, hi = 1, 10
    while stats.ncx2.sf(crit, dof, hi * per_sample) < power:
        hi *= 2
    while lo < hi:
        mid = (lo + hi) // 2
        if stats.ncx2.sf(crit, dof, mid * per_sample) >= power:
            hi = mid
        else:
            lo = mid + 1
    return int(math.ceil(lo))
