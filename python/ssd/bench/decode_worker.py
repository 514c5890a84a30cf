"""One configuration of ``python -m ssd.bench decode``, run in its own process.

Each configuration (engine x dtype x threads, or a bandwidth probe) gets a
fresh process so that thread settings never leak between configurations and
memory is given back. The parent starts ``python -m ssd.bench.decode_worker
JOB_JSON``; the worker prints one ``@@step`` line per unit of progress and
finally ``@@result {json}``.
"""
from __future__ import annotations

import json
import sys
import time

from .cpu_load import ForeignLoad

MARK_STEP = "@@step"
MARK_RESULT = "@@result "


def _step() -> None:
    print(MARK_STEP, flush=True)


def _timed_runs(job: dict, generate_once, own_pids=()) -> dict:
    """One untimed warm-up, then `repeats` timed runs of `generate_once() -> (rate, ttft, tokens)`."""
    generate_once()
    _step()
    rates, ttfts, tokens = [], [], None
    with ForeignLoad(job.get("exclude_pids", ()), own_pids=own_pids) as load:
        for _ in range(job["repeats"]):
            rate, ttft, tokens = generate_once()
            rates.append(rate)
            ttfts.append(ttft)
            _step()
    return {"rates": rates, "ttft_s": ttfts, "token_ids": tokens, "other_cpu_fraction": load.fraction,
            "excluded_cpu_fraction": load.excluded_fraction}


def run_ssd(job: dict) -> dict:
    """ssd in ar mode; times from the engine's own request metrics. With tensor_parallel > 1
    the target is split over that many processes of threads / tensor_parallel threads each
    (their CPU time is this run's own), and the collectives' time per forward is reported."""
    from ssd import LLM, SamplingParams

    if job.get("cpu_isa"):
        from ssd import _C

        _C.set_cpu_isa(job["cpu_isa"])
    tp = job.get("tensor_parallel", 1)
    llm = LLM(target=job["model"], mode="ar", max_model_len=job["max_model_len"],
              target_threads=job["threads"] // tp, dtype=job["dtype"], tensor_parallel_size=tp)
    _step()
    params = SamplingParams(temperature=0, max_tokens=job["max_tokens"], ignore_eos=True)

    def generate_once():
        out = llm.generate([job["prompt_ids"]], params)[0]
        if out.finish_reason == "error" or len(out.token_ids) != job["max_tokens"]:
            raise RuntimeError(f"ssd generate: finish_reason={out.finish_reason} error={out.error} "
                               f"tokens={len(out.token_ids)}")
        m = out.metrics  # seconds since the request was enqueued, measured by the engine
        rate = (len(out.token_ids) - 1) / (m["finish_time"] - m["time_to_first_token"])
        return rate, m["time_to_first_token"], list(out.token_ids)

    try:
        if tp == 1:
            return _timed_runs(job, generate_once)
        before = llm.stats()
        res = _timed_runs(job, generate_once, own_pids=[p.pid for p in llm._workers.procs])
        after = llm.stats()
        calls = after["tensor_parallel_collectives"] - before["tensor_parallel_collectives"]
        forwards = after["steps"] - before["steps"]  # one target forward per engine step (ar)
        res["collectives_per_forward"] = calls / forwards if forwards else None
        res["collective_ms_per_forward"] = ((after["tensor_parallel_collective_s"]
                                             - before["tensor_parallel_collective_s"]) / forwards * 1e3
                                            if forwards else None)
        return res
    finally:
        llm.shutdown()


def run_transformers(job: dict) -> dict:
    """transformers generate; times from a streamer that stamps every token as it is handed out."""
    import torch

    from .peers import StampStreamer, load_hf

    torch.set_num_threads(job["threads"])
    model = load_hf(job["model"], getattr(torch, job["dtype"]))
    _step()
    ids = torch.tensor([job["prompt_ids"]], dtype=torch.long)
    mask = torch.ones_like(ids)
    m = job["max_tokens"]
    pad = model.generation_config.pad_token_id
    if pad is None:
        pad = model.generation_config.eos_token_id
        pad = pad[0] if isinstance(pad, (list, tuple)) else (pad if pad is not None else 0)

    def generate_once():
        streamer = StampStreamer()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m,
                                 do_sample=False, pad_token_id=pad, streamer=streamer)
        new = out[0, ids.shape[1]:].tolist()
        if len(new) != m or len(streamer.stamps) != m:
            raise RuntimeError(f"transformers generate: {len(new)} tokens, {len(streamer.stamps)} stamps")
        rate = (m - 1) / (streamer.stamps[-1] - streamer.stamps[0])
        return rate, streamer.stamps[0] - t0, new

    return _timed_runs(job, generate_once)


def run_bandwidth(job: dict) -> dict:
    """Copy bandwidth of a large fp32 tensor, best of 5, counted as read + write bytes / time."""
    import torch

    torch.set_num_threads(job["threads"])
    n = job["bw_mb"] * (1 << 20) // 4
    src = torch.ones(n, dtype=torch.float32)  # touches every page before timing
    dst = torch.zeros(n, dtype=torch.float32)
    dst.copy_(src)
    best = float("inf")
    with ForeignLoad() as load:
        for _ in range(5):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    _step()
    return {"bytes": 2 * n * 4, "seconds": best, "gbps": 2 * n * 4 / best / 1e9,
            "other_cpu_fraction": load.fraction}


def run_llamacpp(job: dict) -> dict:
    """llama.cpp's llama-bench on the job's file: prefill, then decode at the prompt's depth (bench.llamacpp)."""
    from .llamacpp import run_bench

    _step()
    with ForeignLoad(job.get("exclude_pids", ()), own_children=True) as load:
        prefill = run_bench(job, prefill=True)
        _step()
        rates = run_bench(job, prefill=False)
    for _ in range(job["repeats"]):
        _step()
    return {"rates": rates, "prefill_rates": prefill, "ttft_s": None, "token_ids": None,
            "other_cpu_fraction": load.fraction, "excluded_cpu_fraction": load.excluded_fraction}


WORKERS = {"ssd": run_ssd, "transformers": run_transformers, "llamacpp": run_llamacpp, "bandwidth": run_bandwidth}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m ssd.bench.decode_worker JOB_JSON (started by python -m ssd.bench decode)",
              file=sys.stderr)
        return 2
    job = json.loads(argv[0])
    if job.get("kind") not in WORKERS:
        print(f"decode_worker: unknown job kind {job.get('kind')!r} (one of {', '.join(WORKERS)})", file=sys.stderr)
        return 2
    print(MARK_RESULT + json.dumps(WORKERS[job["kind"]](job)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
