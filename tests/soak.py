"""Soak test: many random requests over several modes, from several threads.

    python -m tests.soak                    # 10,000 requests (about a minute on 2 cores)
    python -m tests.soak --requests 500     # a shorter run

Every request is random: prompt, length, sampling parameters, stop ids, and
how it is consumed (generate() in batches, a stream read to the end, or a
stream closed early, which cancels it). Requests go to an ar, an sd and
four ssd engines (one with a KV cache small enough to preempt, one whose draft
is the target itself, so that its cache hits) from four client threads at once. Checks, each counted in the summary:
  * every request ends with a finish reason, and "error" never;
  * every greedy request's tokens equal ar's (a prefix of them when cancelled);
  * resident memory is flat: the growth over the second half of the run stays
    under --max-growth-mb.
Prints a JSON summary; exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

from tqdm import tqdm

from ssd import LLM, SamplingParams
from tests.reference.tiny_models import TinySpec, build_tiny_model

VOCAB = 256
ENGINES = {  # name: engine settings (target and draft are added)
    "ar": dict(mode="ar"),
    "sd": dict(mode="sd", adaptive=False, k=4),
    "ssd-auto": dict(mode="ssd", adaptive=False, k=4, fallback="auto"),
    "ssd-fast-geometric": dict(mode="ssd", adaptive=False, k=3, fallback="fast", fanout="geometric"),
    "ssd-preempting": dict(mode="ssd", adaptive=False, k=4, kv_block_size=8, kv_capacity_tokens=160, max_batch=16),
    # The target as its own draft: proposals are accepted and the cache hits.
    "ssd-self-draft": dict(mode="ssd", adaptive=False, k=4, draft_matmul_min_rows=0, self_draft=True),
}


def resident_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def random_request(rng: random.Random):
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 60))]
    greedy = rng.random() < 0.5
    params = SamplingParams(
        temperature=0.0 if greedy else rng.choice([0.5, 1.0, 1.5]),
        top_k=rng.choice([0, 0, 5, 50]), top_p=rng.choice([1.0, 1.0, 0.9, 0.5]),
        max_tokens=rng.randrange(1, 64), ignore_eos=rng.random() < 0.5,
        stop_token_ids=[rng.randrange(VOCAB)] if rng.random() < 0.2 else [],
        seed=rng.randrange(2**64) if rng.random() < 0.5 else None)
    how = rng.choice(["generate", "generate", "stream", "cancel"])
    return prompt, params, how


class Soak:
    def __init__(self, target, draft, args):
        self.args = args
        def draft_of(kw):
            return None if kw["mode"] == "ar" else target if kw.pop("self_draft", False) else draft

        self.engines = {name: LLM(target, draft=draft_of(dict(kw)), max_model_len=128,
                                  **{k: v for k, v in kw.items() if k != "self_draft"})
                        for name, kw in ENGINES.items()}
        self.oracle = LLM(target, max_model_len=128, max_batch=64)
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "finished": 0, "cancelled": 0, "errors": 0, "greedy_checked": 0,
                       "mismatches": 0, "no_finish_reason": 0}
        self.failures: list[str] = []

    def record(self, name, prompt, params, tokens, reason, error, closed_early):
        with self.lock:
            self.counts["requests"] += 1
            if reason is None and not closed_early:
                self.counts["no_finish_reason"] += 1
                self.failures.append(f"{name}: a request ended without a finish reason")
            elif reason == "error":
                self.counts["errors"] += 1
                self.failures.append(f"{name}: error: {error}")
            elif reason == "cancelled" or closed_early:
                self.counts["cancelled"] += 1
            else:
                self.counts["finished"] += 1
        if params.temperature == 0 and reason != "error":
            want = self.oracle.generate([prompt], params)[0].token_ids
            ok = tokens == want if not closed_early and reason != "cancelled" else tokens == want[:len(tokens)]
            with self.lock:
                self.counts["greedy_checked"] += 1
                if not ok:
                    self.counts["mismatches"] += 1
                    self.failures.append(f"{name}: greedy output differs from ar for prompt {prompt[:8]}...")

    def client(self, seed: int, n: int, bar, memory: list):
        rng = random.Random(seed)
        done = 0
        while done < n:
            name = rng.choice(list(self.engines))
            llm = self.engines[name]
            prompt, params, how = random_request(rng)
            if how == "generate":
                batch = [random_request(rng)[:2] for _ in range(rng.randrange(0, 7))] + [(prompt, params)]
                batch = batch[: n - done]
                outs = llm.generate([p for p, _ in batch], [q for _, q in batch])
                for (p, q), o in zip(batch, outs):
                    self.record(name, p, q, o.token_ids, o.finish_reason, o.error, False)
                step = len(batch)
            else:
                stream = llm.stream(prompt, params)
                tokens, reason, error = [], None, None
                stop_after = rng.randrange(1, 8) if how == "cancel" else None
                for i, chunk in enumerate(stream):
                    tokens += chunk.token_ids
                    reason, error = chunk.finish_reason, chunk.error
                    if stop_after is not None and i + 1 >= stop_after and reason is None:
                        stream.close()
                        break
                self.record(name, prompt, params, tokens, reason, error, reason is None)
                step = 1
            done += step
            bar.update(step)
            with self.lock:
                memory.append((self.counts["requests"], resident_mb()))

    def run(self) -> dict:
        args = self.args
        per_client = [args.requests // args.clients + (i < args.requests % args.clients) for i in range(args.clients)]
        memory: list = []
        t0 = time.perf_counter()
        with tqdm(total=args.requests, desc="soak", unit="req") as bar:
            threads = [threading.Thread(target=self.client, args=(args.seed + i, n, bar, memory), daemon=True)
                       for i, n in enumerate(per_client)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        half = [mb for count, mb in memory if count >= args.requests // 2]
        summary = {**self.counts, "seconds": round(time.perf_counter() - t0, 1),
                   "resident_mb_start": round(memory[0][1], 1), "resident_mb_half": round(half[0], 1),
                   "resident_mb_end": round(memory[-1][1], 1),
                   "engines": {name: {k: llm.stats()[k] for k in ("num_preemptions", "rounds", "cache_hits")}
                               for name, llm in self.engines.items()}}
        growth = summary["resident_mb_end"] - summary["resident_mb_half"]
        if growth > args.max_growth_mb:
            self.failures.append(f"resident memory grew {growth:.0f} MB over the second half")
        summary["failures"] = self.failures[:20]
        return summary

    def close(self):
        for llm in [*self.engines.values(), self.oracle]:
            llm.shutdown()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-growth-mb", type=float, default=64.0,
                    help="allowed resident-memory growth over the second half of the run (default 64)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        target, _ = build_tiny_model(TinySpec(vocab_size=VOCAB, num_layers=3, seed=1, init_std=0.1), Path(root) / "t")
        draft, _ = build_tiny_model(TinySpec(vocab_size=VOCAB, num_layers=1, seed=2, init_std=0.1), Path(root) / "d")
        soak = Soak(target, draft, args)
        try:
            summary = soak.run()
        finally:
            soak.close()
    print(json.dumps(summary, indent=1))
    return 1 if summary["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
