"""The AR engine: continuous batching, preemption, stop conditions, cancel, errors."""
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from ssd import LLM, EngineConfig, SamplingParams
from tests.reference.tiny_models import TinySpec, build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    spec = TinySpec(vocab_size=512, num_kv_heads=2, seed=1)
    path, _ = build_tiny_model(spec, tmp_path_factory.mktemp("engine"))
    return path


def greedy(max_tokens, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def test_preemption_keeps_outputs_exact(model_dir):
    rng = random.Random(0)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(4, 60))] for _ in range(64)]
    lengths = [rng.randrange(8, 48) for _ in prompts]
    params = [greedy(n) for n in lengths]
    with LLM(model_dir, max_model_len=128, max_batch=32, kv_block_size=8, kv_capacity_tokens=768) as small:
        batched = small.generate(prompts, params)
        stats = small.stats()
    with LLM(model_dir, max_model_len=128, max_batch=1) as solo:
        single = [solo.generate([p], q)[0] for p, q in zip(prompts, params)]
    assert stats["peak_batch"] >= 8
    assert stats["num_preemptions"] >= 1
    assert any(o.metrics["num_preemptions"] > 0 for o in batched)
    for b, s, n in zip(batched, single, lengths):
        assert b.finish_reason == "length" and len(b.token_ids) == n
        assert b.token_ids == s.token_ids


def test_stop_conditions(model_dir):
    with LLM(model_dir, max_model_len=64) as llm:
        base = llm.generate([[1, 2, 3]], greedy(20))[0].token_ids
        stop_tok = base[5]
        first = base.index(stop_tok)
        out = llm.generate([[1, 2, 3]], greedy(20, stop_token_ids=[stop_tok]))[0]
        assert out.finish_reason == "stop" and out.token_ids == base[: first + 1]
        # eos ends a request unless ignore_eos
        eos_llm_ids = llm.model.eos_token_ids
        out = llm.generate([[1, 2, 3]], greedy(20))[0]
        if any(t in eos_llm_ids for t in base):
            assert out.finish_reason == "stop"
        # max_model_len caps the length
        out = llm.generate([list(range(60))], greedy(50))[0]
        assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_cancel_and_isolation(model_dir):
    with LLM(model_dir, max_model_len=256) as llm:
        want = llm.generate([[7, 8, 9]], greedy(100))[0].token_ids
        a, b = llm._dispatcher.submit(llm._prepare([[5, 6], [7, 8, 9]], [greedy(200), greedy(100)]))
        deadline = time.time() + 60
        while len(a.output.token_ids) < 3 and not a.done.is_set() and time.time() < deadline:
            time.sleep(0.005)
        a.cancel()
        out_a, out_b = a.wait(), b.wait()
        assert out_a.finish_reason == "cancelled" and 3 <= len(out_a.token_ids) < 200
        assert out_b.finish_reason == "length" and out_b.token_ids == want


def test_stream_matches_generate(model_dir):
    with LLM(model_dir, max_model_len=64) as llm:
        want = llm.generate([[3, 1, 4, 1, 5]], greedy(12))[0].token_ids
        chunks = list(llm.stream([3, 1, 4, 1, 5], greedy(12)))
        assert [t for c in chunks for t in c.token_ids] == want
        assert chunks[-1].finish_reason == "length"
        # Closing a stream early cancels its request.
        it = llm.stream([3, 1, 4], greedy(40))
        next(it)
        it.close()
        assert llm.generate([[3, 1, 4, 1, 5]], greedy(12))[0].token_ids == want


def native_threads() -> int:
    """Threads of this process that Python did not start (the engine's)."""
    return len(set(os.listdir("/proc/self/task")) - {str(t.native_id) for t in threading.enumerate()})


def test_shutdown_cancels_pending_and_stops_threads(model_dir):
    time.sleep(0.2)  # a thread joined by Python can still be exiting in the OS
    before = native_threads()
    llm = LLM(model_dir, max_model_len=256, target_threads=2)
    assert native_threads() == before + 2  # the engine thread and one pool worker
    handles = llm._dispatcher.submit(llm._prepare([[1, 2, 3]] * 4, greedy(200)))
    llm.shutdown()
    reasons = [h.wait().finish_reason for h in handles]
    assert set(reasons) <= {"cancelled", "length"} and "cancelled" in reasons
    deadline = time.time() + 10
    while native_threads() != before and time.time() < deadline:
        time.sleep(0.01)
    assert native_threads() == before
    assert not [t for t in threading.enumerate() if t.name == "ssd-response-dispatcher"]


def test_bad_request_values_raise_before_queueing(model_dir):
    with LLM(model_dir, max_model_len=32) as llm:
        ok = greedy(4)
        with pytest.raises(ValueError, match="prompt 1: 40 tokens do not fit max_model_len 32"):
            llm.generate([[1, 2], list(range(40))], ok)
        with pytest.raises(ValueError, match="prompt 0: token id 512 is outside"):
            llm.generate([[512]], ok)
        with pytest.raises(ValueError, match="prompt 2: is empty"):
            llm.generate([[1], [2], []], ok)
        with pytest.raises(ValueError, match="params: got 1 SamplingParams for 2 prompts"):
            llm.generate([[1], [2]], [ok])
        assert llm.stats()["num_finished"] == 0 and llm.stats()["steps"] == 0
        # Nothing was queued, and the engine still serves.
        assert len(llm.generate([[1, 2]], ok)[0].token_ids) == 4


def test_generate_queues_the_batch_at_once(model_dir):
    """All of generate()'s requests reach the engine together: the first step
    prefills every prompt, so n tokens each take exactly n steps (a staggered
    start would add steps, and would count prefill as decode time)."""
    rng = random.Random(3)
    prompts = [[rng.randrange(512) for _ in range(rng.randrange(5, 40))] for _ in range(8)]
    for _ in range(6):  # the engine thread's wake-up races the enqueues: try several times
        with LLM(model_dir, max_model_len=64, max_batch=8) as llm:
            outs = llm.generate(prompts, greedy(12))
            assert llm.stats()["steps"] == 12
        assert all(len(o.token_ids) == 12 for o in outs)


def test_enqueue_batch_is_all_or_nothing(model_dir):
    with LLM(model_dir, max_model_len=32) as llm:
        ok = greedy(3).core_dict()
        with pytest.raises(ValueError, match="request 1: prompt: token id 600 is outside"):
            llm._engine.enqueue_batch([([1, 2], ok), ([600], ok)])
        with pytest.raises(ValueError, match="request 0: temperature"):
            llm._engine.enqueue_batch([([1], {**ok, "temperature": -1.0})])
        assert llm.stats()["steps"] == 0  # nothing was queued
        handles = llm._dispatcher.submit(llm._prepare([[1, 2], [3]], greedy(3)))
        assert len({h.id for h in handles}) == 2
        assert [h.wait().finish_reason for h in handles] == ["length", "length"]


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.5), ("temperature", float("nan")), ("top_k", -3), ("top_p", 0.0),
    ("top_p", 1.5), ("max_tokens", 0), ("seed", -1), ("stop", [""]), ("stop_token_ids", [-1]),
])
def test_invalid_sampling_values(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("field,value", [
    ("mode", "fast"), ("max_model_len", -1), ("max_batch", -1), ("kv_block_size", 0),
    ("kv_capacity_tokens", -5), ("dtype", "float16"), ("target_device", "tpu"), ("target_threads", 0),
    ("k", 0),
])
def test_invalid_engine_config(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_kv_capacity_must_hold_one_sequence():
    with pytest.raises(ValueError, match=r"kv_capacity_tokens: must hold at least one sequence of max_model_len \(64\)"):
        EngineConfig(max_model_len=64, kv_capacity_tokens=10)


@pytest.mark.parametrize("backend", ["auto", "aten"])
def test_runtime_failure_ends_only_that_request(model_dir, tmp_path, backend):
    # A checkpoint with one NaN embedding row: any sequence containing that
    # token produces NaN logits. Rows never mix, so its batch-mates are unaffected.
    # "aten": the NaN is found on the device side of the round (target_round.h).
    prompts = [[1, 2, 3], [4, 5]]
    with LLM(model_dir, max_model_len=64, backend=backend) as good_llm:
        want = good_llm.generate(prompts, greedy(10))
    used = {t for o in want for t in o.token_ids} | {t for p in prompts for t in p}
    poison = next(t for t in range(6, 512) if t not in used)
    bad = tmp_path / "nan_row"
    bad.mkdir()
    for f in model_dir.iterdir():
        if f.name != "model.safetensors":
            (bad / f.name).write_bytes(f.read_bytes())
    weights = load_file(model_dir / "model.safetensors")
    weights["model.embed_tokens.weight"][poison] = float("nan")
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    with LLM(bad, max_model_len=64, backend=backend) as llm:
        outs = llm.generate([prompts[0], [4, poison, 6], prompts[1]], greedy(10))
    assert outs[1].finish_reason == "error" and "NaN" in outs[1].error
    assert outs[0].token_ids == want[0].token_ids and outs[2].token_ids == want[1].token_ids


def test_import_is_light():
    code = "import sys, ssd; ssd.SamplingParams; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_shutdown_is_idempotent_and_exit_is_clean(model_dir):
    """shutdown() twice is fine, later use raises, and an LLM still alive at interpreter exit
    (collected during teardown) leaves stderr clean."""
    code = (
        "from ssd import LLM, SamplingParams\n"
        f"llm = LLM({str(model_dir)!r}, max_model_len=64)\n"
        "llm.generate([[1, 2]], SamplingParams(max_tokens=2))\n"
        "llm.shutdown(); llm.shutdown()\n"
        "try:\n"
        "    llm.generate([[1, 2]], SamplingParams(max_tokens=2))\n"
        "    raise SystemExit('generate after shutdown did not raise')\n"
        "except RuntimeError as e:\n"
        "    assert 'shut down' in str(e)\n"
        f"kept = LLM({str(model_dir)!r}, max_model_len=64)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
