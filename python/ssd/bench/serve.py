"""``python -m ssd.bench serve``: a request-rate sweep against ssd's HTTP server.

Requests arrive as a Poisson process at each rate (exponential gaps, seeded),
with prompts from the bundled datasets (MT-bench and HumanEval, chat
template), each streamed (`/v1/chat/completions`, temperature 0 by default).
Per rate it reports:

    TTFT           send -> first content chunk, p50 / p99 over requests
    ITL            time between two content chunks (a chunk is one token; the tokens of one
                   verification arrive together, ~0 apart), p50 / p99 over all gaps
    TPOT           a request's (last token - first token) / (tokens - 1), p50 over requests
    output tok/s   tokens received / (last token of the rate's last request - first send)

Against a running server (``--url``), or, with ``--modes``, against servers it
hosts itself on 127.0.0.1 one mode after another, on the CONSTRUCTED regime
pair (``ssd.testing.regime_pair``) or ``--target``/``--draft``.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path

from .record import BENCH_PROG, command_line, write_result

PROG = f"{BENCH_PROG} serve"
MODES = ("ar", "sd", "ssd")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="default run (3 modes x 3 rates x 8 requests): about 8 min on 2 cores, after the pair is built")
    ap.add_argument("--url", help="a running ssd server (e.g. http://127.0.0.1:8000); else servers are hosted here")
    ap.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES),
                    help="modes to host, comma-separated (default ar,sd,ssd; ignored with --url)")
    ap.add_argument("--target", type=Path, help="target model to host (default: the constructed regime pair)")
    ap.add_argument("--draft", type=Path, help="draft model to host (with --target)")
    ap.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[0.1, 0.25, 0.5],
                    help="request rates, requests/s, comma-separated (default 0.1,0.25,0.5)")
    ap.add_argument("--requests", type=int, default=8, help="requests per rate (default 8)")
    ap.add_argument("--max-tokens", type=int, default=48, help="max_tokens per request (default 48)")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0, help="seeds the arrivals and the prompt order")
    ap.add_argument("--max-batch", type=int, default=8, help="hosted servers' max_batch (default 8)")
    ap.add_argument("--json", type=Path, help="write results as JSON")
    ap.add_argument("--plot", type=Path, help="write a PNG of TTFT, ITL and tok/s against the rate")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1 or not args.rates or min(args.rates) <= 0:
        ap.error("--requests, --max-tokens and every rate must be positive")
    bad = [m for m in args.modes if m not in MODES]
    if bad:
        ap.error(f"--modes: unknown mode {bad[0]!r} (one of {', '.join(MODES)})")
    if args.draft and not args.target:
        ap.error("--draft needs --target")
    return args


def prompts(n: int, seed: int) -> list[str]:
    from ssd.assets import humaneval_prompts, mtbench_prompts

    pool = mtbench_prompts() + humaneval_prompts()
    random.Random(seed).shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


async def _one(client, url, model, prompt, args, t0) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": args.max_tokens,
            "temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter() - t0
    first = last = None
    gaps: list[float] = []
    tokens = 0
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            return {"sent": sent, "status": r.status_code, "error": (await r.aread()).decode()[:200]}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            part = json.loads(line[6:])
            now = time.perf_counter() - t0
            if part.get("usage"):
                tokens = part["usage"]["completion_tokens"]
                continue
            for c in part["choices"]:
                if c["delta"].get("content"):
                    if first is None:
                        first = now
                    elif last is not None:
                        gaps.append(now - last)
                    last = now
    return {"sent": sent, "status": 200, "ttft": None if first is None else first - sent, "end": last or sent,
            "tokens": tokens, "gaps": gaps}


async def _sweep_rate(url, model, rate, args, rng) -> dict:
    import httpx

    texts = prompts(args.requests, rng.randrange(2**31))
    async with httpx.AsyncClient(timeout=600) as client:
        t0 = time.perf_counter()
        tasks = []
        for text in texts:
            tasks.append(asyncio.ensure_future(_one(client, url, model, text, args, t0)))
            await asyncio.sleep(rng.expovariate(rate))
        results = await asyncio.gather(*tasks)
    ok = [r for r in results if r["status"] == 200 and r["ttft"] is not None]
    ttft = sorted(r["ttft"] for r in ok)
    itl = sorted(g for r in ok for g in r["gaps"])
    tpot = sorted((r["end"] - r["sent"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1)
    span = max((r["end"] for r in ok), default=0) - min((r["sent"] for r in results), default=0)
    tokens = sum(r["tokens"] for r in ok)
    return {"rate": rate, "requests": len(results), "completed": len(ok), "tokens": tokens,
            "ttft_p50": _pct(ttft, 50), "ttft_p99": _pct(ttft, 99), "itl_p50": _pct(itl, 50),
            "itl_p99": _pct(itl, 99), "tpot_p50": _pct(tpot, 50), "output_tok_s": tokens / span if span > 0 else None,
            "errors": [r["error"] for r in results if r["status"] != 200][:3]}


def _pct(xs: list[float], q: float) -> float | None:
    """Nearest-rank percentile of sorted xs."""
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def sweep(url: str, label: str, args, bar) -> dict:
    import httpx

    model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
    rng = random.Random(args.seed)
    points = []
    for rate in args.rates:
        bar.set_postfix_str(f"{label} {rate:g} req/s")
        points.append(asyncio.run(_sweep_rate(url, model, rate, args, rng)))
        bar.update(1)
    return {"label": label, "model": model, "points": points}


def hosted(mode: str, args):
    """A ServerThread serving `mode` on the pair; (server, llm)."""
    from ssd import LLM
    from ssd.async_llm import AsyncLLM
    from ssd.serve import ServerState, ServerThread

    if args.target is not None:
        target, draft = args.target, args.draft
    else:
        from ssd.testing import regime_pair

        pair = regime_pair()
        target, draft = pair.target, pair.draft
    llm = LLM(str(target), mode=mode, draft=None if mode == "ar" else str(draft), max_model_len=1024,
              max_batch=args.max_batch, kv_cache_gib=1.0)
    state = ServerState(AsyncLLM(llm), model_name=f"{Path(target).name}-{mode}", max_in_flight=10_000)
    return ServerThread(state), llm


def table(runs: list[dict]) -> str:
    head = (f"{'server':<12} {'req/s':>6} {'done':>5} {'TTFT p50':>9} {'p99':>7} {'ITL p50':>8} {'p99':>7} "
            f"{'TPOT p50':>8} {'out tok/s':>9}")
    lines = [head, "-" * len(head)]
    f = lambda x, s: "-" if x is None else format(x, s)  # noqa: E731
    for run in runs:
        for p in run["points"]:
            lines.append(f"{run['label']:<12} {p['rate']:>6g} {p['completed']:>2}/{p['requests']:<2} "
                         f"{f(p['ttft_p50'], '.2f'):>9} {f(p['ttft_p99'], '.2f'):>7} "
                         f"{f(p['itl_p50'] and 1000 * p['itl_p50'], '.0f'):>6}ms {f(p['itl_p99'] and 1000 * p['itl_p99'], '.0f'):>5}ms "
                         f"{f(p['tpot_p50'] and 1000 * p['tpot_p50'], '.0f'):>6}ms {f(p['output_tok_s'], '.1f'):>9}")
    lines.append("TTFT in s; ITL: gaps between streamed tokens; out tok/s = tokens received / (last token - first send)")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> Path:
    from .plots import MODE_COLORS, _pyplot, _save

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for run in runs:
        mode = run["label"].split()[0]
        color = MODE_COLORS.get(mode)
        rates = [p["rate"] for p in run["points"]]
        for ax, key, scale in ((axes[0], "ttft_p50", 1), (axes[1], "tpot_p50", 1000), (axes[2], "output_tok_s", 1)):
            ys = [None if p[key] is None else p[key] * scale for p in run["points"]]
            ax.plot(rates, ys, marker="o", label=run["label"], color=color)
    for ax, title in zip(axes, ("TTFT p50 (s)", "time per output token p50 (ms)", "output tok/s")):
        ax.set_xlabel("request rate (req/s, Poisson)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[2].legend()
    fig.suptitle("ssd serve: request-rate sweep (streamed chat completions)")
    return _save(plt, fig, path, rect=(0, 0, 1, 0.93))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    from tqdm.auto import tqdm

    t_start = time.perf_counter()
    runs = []
    targets = [None] if args.url else args.modes
    with tqdm(total=len(targets) * len(args.rates), desc="serve bench", unit="rate", dynamic_ncols=True) as bar:
        for mode in targets:
            if args.url:
                runs.append(sweep(args.url.rstrip("/"), "server", args, bar))
                continue
            server, llm = hosted(mode, args)
            try:
                with server:
                    runs.append(sweep(server.url, mode, args, bar))
            finally:
                llm.shutdown()
    print()
    print(table(runs))
    meta = {"rates": args.rates, "requests_per_rate": args.requests, "max_tokens": args.max_tokens,
            "temperature": args.temperature, "seed": args.seed, "max_batch": args.max_batch,
            "pair": "given" if args.target else "constructed regime pair (acceptance 0.75, cost ratio 0.25)",
            "wall_seconds": round(time.perf_counter() - t_start, 1)}
    if args.json:
        print(f"wrote {write_result(args.json, {'meta': meta, 'runs': runs}, command_line(['serve', *argv], BENCH_PROG))}")
    if args.plot:
        print(f"wrote {plot(runs, args.plot)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
