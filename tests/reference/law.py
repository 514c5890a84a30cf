"""Exact output laws of small-vocabulary models, for the speculative modes' G-tests.

The law of the first n tokens after a prompt is enumerated from the model's
own next-token distributions (processed like the engine: temperature, top-k,
top-p). The tested distributions are each position's marginal and one
cross-round pair of positions.
"""
import numpy as np

from tests.reference.sampling_ref import processed_probs


def exact_joint(model, prompt, n_tokens, vocab, temperature, top_k, top_p):
    """[vocab] * n_tokens array: the probability of each continuation."""
    law = {(): 1.0}
    for _ in range(n_tokens):
        nxt = {}
        for prefix, mass in law.items():
            probs = processed_probs(model.logits(list(prompt) + list(prefix))[-1], temperature, top_k, top_p)
            for t in range(vocab):
                if probs[t] > 0:
                    nxt[prefix + (t,)] = mass * float(probs[t])
        law = nxt
    out = np.zeros(vocab ** n_tokens)
    for seq, mass in law.items():
        out[np.ravel_multi_index(seq, (vocab,) * n_tokens)] = mass
    return out.reshape((vocab,) * n_tokens)


def views(arr, pair=(3, 4)):
    """Each position's marginal and the joint of the positions in `pair`."""
    n = arr.ndim
    out = [arr.sum(axis=tuple(a for a in range(n) if a != pos)) for pos in range(n)]
    out.append(arr.sum(axis=tuple(a for a in range(n) if a not in pair)).ravel())
    return out


def counts_of(outputs, vocab, n_tokens):
    counts = np.zeros((vocab,) * n_tokens)
    for o in outputs:
        assert len(o.token_ids) == n_tokens
        counts[tuple(o.token_ids)] += 1
    return counts


def assert_law_and_power(counts, expected_joint, wrong_joint):
    """The sampled counts fit expected_joint's views (G-test p > 0.001 on each) and the same
    test rejects wrong_joint (p < 1e-6 on some view): it could have seen a wrong law."""
    from tests.reference.stats import g_test

    observed = views(counts)
    for expected, got in zip(views(expected_joint), observed):
        assert g_test(got, expected) > 0.001
    assert min(g_test(o, w) for o, w in zip(observed, views(wrong_joint))) < 1e-6
