"""AsyncLLM: the engine from asyncio, over the response dispatcher (tiny random models, token ids)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ssd import LLM, SamplingParams
from ssd.async_llm import AsyncLLM


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, **kw)


@pytest.fixture(scope="module")
def engine(pair):
    with LLM(pair[0], max_model_len=256, max_batch=8) as llm:
        yield AsyncLLM(llm)


async def collect(engine, prompt, params, request_id=None):
    tokens, last = [], None
    async for chunk in engine.generate(prompt, params, request_id):
        tokens += chunk.token_ids
        last = chunk
    return tokens, last.finish_reason


def idle(engine) -> bool:
    s = engine.stats()
    return s["num_running"] == 0 and s["num_waiting"] == 0 and s["kv_blocks_free"] == s["kv_blocks_total"]


def test_streams_equal_generate(engine):
    prompts = [[i, 7, 9] for i in range(6)]
    want = [o.token_ids for o in engine.llm.generate(prompts, greedy(30))]

    async def main():
        return await asyncio.gather(*(collect(engine, p, greedy(30)) for p in prompts))

    got = asyncio.run(main())
    assert [t for t, _ in got] == want and all(r == "length" for _, r in got)
    assert engine.num_in_flight() == 0


def test_leaving_early_cancels_and_frees_the_kv(engine):
    async def main():
        async for chunk in engine.generate([1, 2, 3], greedy(200, ignore_eos=True)):
            assert chunk.finish_reason is None
            break  # the async generator is closed: the request is cancelled
        for _ in range(200):
            if idle(engine):
                return True
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())
    assert engine.num_in_flight() == 0


def test_abort_by_id(engine):
    async def main():
        request = engine.submit([4, 5], greedy(200, ignore_eos=True), request_id="mine")
        with pytest.raises(ValueError, match="request_id: 'mine' is already in flight"):
            engine.submit([4, 5], greedy(2), request_id="mine")
        reasons = []
        async for chunk in request:
            if not reasons:
                assert engine.abort("mine")
            reasons.append(chunk.finish_reason)
        return reasons[-1], request.output

    reason, output = asyncio.run(main())
    assert reason == "cancelled" and output.finish_reason == "cancelled"
    assert not engine.abort("mine")  # ended: nothing to abort


def test_event_loops_on_several_threads(engine):
    """Each request's chunks reach the loop that submitted it."""
    want = engine.llm.generate([[9, 9, 9]], greedy(40))[0].token_ids
    results, errors = [], []

    def worker():
        try:
            results.append(asyncio.run(collect(engine, [9, 9, 9], greedy(40))))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and results == [(want, "length")] * 4


def test_bad_input_raises_before_anything_is_queued(engine):
    async def main():
        with pytest.raises(ValueError, match="prompt 0: token id 999 is outside the vocabulary"):
            engine.submit([1, 999], greedy(4))

    asyncio.run(main())
    assert engine.num_in_flight() == 0


def test_shutdown_ends_every_stream(pair):
    llm = LLM(pair[0], max_model_len=256)
    engine = AsyncLLM(llm)

    async def main():
        request = engine.submit([1, 2], greedy(250, ignore_eos=True))
        reasons = []
        async for chunk in request:
            if not reasons:
                await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)
            reasons.append(chunk.finish_reason)
        return reasons[-1]

    assert asyncio.run(main()) in ("cancelled", "length")  # shut down before the end, or it ended first
    with pytest.raises(RuntimeError, match="shut down"):
        asyncio.run(collect(engine, [1], greedy(2)))


def test_a_request_never_iterated_leaves_when_it_finishes_or_is_dropped(engine):
    """The registry holds requests weakly: one that finishes unread is no longer in flight, and one whose
    handle is dropped is cancelled (it held its KV blocks and its slot in num_in_flight for ever)."""
    import gc

    async def main():
        kept = engine.submit([1, 2, 3], greedy(4))
        for _ in range(500):
            if engine.num_in_flight() == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.num_in_flight() == 0 and kept.output.finish_reason == "length"
        assert len([c async for c in kept]) >= 1  # still readable, to its last chunk

        dropped = engine.submit([4, 5, 6], greedy(250, ignore_eos=True))
        handle = dropped._handle
        del dropped
        gc.collect()
        assert engine.num_in_flight() == 0
        # The engine goes idle before the dispatcher thread has handed the final response to the
        # handle: wait for both.
        for _ in range(500):
            if idle(engine) and handle.output.finish_reason is not None:
                return handle.output.finish_reason == "cancelled"
            await asyncio.sleep(0.01)
        return False

    assert asyncio.run(main())
