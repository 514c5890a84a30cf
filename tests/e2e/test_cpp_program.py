"""ssd_generate: a C++ program that loads a HuggingFace directory itself (no
Python in its process) and generates with the core Engine, token for token
what ``ssd.LLM`` generates for the same token ids and settings.

The program is built from this checkout with the settings setup.py builds the
extension with, so both run identically compiled kernels: in setup.py's own
build folder when it holds a build for this Python and torch (the core's
objects are there already, so only the program compiles and links), else
configured into build/cpp (kept between runs, so later runs only relink what
changed).
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ssd import LLM, SamplingParams
from ssd.models import ModelLoadError, load
from tests.reference.tiny_models import TinySpec, build_tiny_model, random_hf_model

REPO = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO / "build" / "cpp"
MAX_MODEL_LEN = 64
PROMPTS = [[1, 2, 3], [200, 13, 77, 5, 5, 91, 240, 18, 64, 3, 150, 42, 9, 120], [7]]
SAMPLINGS = {
    "greedy": dict(temperature=0.0),
    "temp1-seeded": dict(temperature=1.0, seed=1234),
    "topk-topp-seeded": dict(temperature=0.8, top_k=20, top_p=0.9, seed=99),
}
FLAGS = {"max_tokens": "--max-tokens", "temperature": "--temperature", "top_k": "--top-k",
         "top_p": "--top-p", "seed": "--seed"}


def extension_build() -> tuple[Path, str] | None:
    """setup.py's build folder for this Python and torch and the cmake that
    configured it, when it holds a configured build (setup.py's own rules: its
    folder name, and a cache not configured for another Python or torch)."""
    spec = importlib.util.spec_from_file_location("ssd_setup", REPO / "setup.py")
    setup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup)
    folder = Path(os.environ.get("SSD_BUILD_DIR") or
                  REPO / "build" / setup.build_dir_name(setup.python_tag(), setup.torch_version()))
    cache = folder / "CMakeCache.txt"
    if not cache.is_file() or not (folder / "build.ninja").is_file():
        return None
    text = cache.read_text(errors="replace")
    cmake = setup.cache_entry(text, "CMAKE_COMMAND")
    if setup.cache_entry(text, "Python_EXECUTABLE") != sys.executable or not cmake or not Path(cmake).is_file():
        return None
    return None if setup.needs_fresh(text, sys.executable, setup.torch_cmake_dir()) else (folder, cmake)


@pytest.fixture(scope="session")
def program() -> Path:
    """Builds (or brings up to date) the ssd_generate binary."""
    found = extension_build()
    if found is not None:
        folder, cmake = found
        build = [cmake, "--build", str(folder), "--target", "ssd_generate"]
        proc = subprocess.run(build, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(build)} failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
        return folder / "ssd_generate"
    cuda = os.environ.get("SSD_CUDA", "auto")
    configure = ["cmake", "-S", str(REPO), "-B", str(BUILD_DIR), "-G", "Ninja",
                 "-DSSD_BUILD_PYTHON=OFF", f"-DPython_EXECUTABLE={sys.executable}",
                 "-DCMAKE_BUILD_TYPE=Release", f"-DSSD_CUDA={cuda}"]
    if cuda == "off":
        configure.append("-DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON")
    build = ["cmake", "--build", str(BUILD_DIR), "--target", "ssd_generate"]
    for cmd in (configure, build):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd)} failed:\n{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")
    return BUILD_DIR / "ssd_generate"


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    """Random tiny checkpoints: llama (GQA, llama3 rope, biases), sharded llama, tied qwen3."""
    root = tmp_path_factory.mktemp("cpp_program")
    llama_spec = TinySpec(num_kv_heads=2, llama3_rope=True, attention_bias=True, mlp_bias=True, seed=3)
    llama, _ = build_tiny_model(llama_spec, root / "llama")
    qwen3_spec = TinySpec(arch="qwen3", num_kv_heads=2, head_dim=32, tie_word_embeddings=True, seed=5)
    qwen3, _ = build_tiny_model(qwen3_spec, root / "qwen3-tied")
    sharded = root / "llama-sharded"
    random_hf_model(TinySpec(num_kv_heads=1, seed=4)).save_pretrained(sharded, max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    return {"llama": llama, "llama-sharded": sharded, "qwen3-tied": qwen3}


def run_program(program: Path, *args: str, prompts=PROMPTS) -> subprocess.CompletedProcess:
    """Runs ``program ARGS -- PROMPTS`` (prompts separated by ',')."""
    ids: list[str] = []
    for i, prompt in enumerate(prompts):
        ids += ([","] if i else []) + [str(t) for t in prompt]
    return subprocess.run([str(program), *args, "--", *ids], capture_output=True, text=True, timeout=300)


def program_outputs(proc: subprocess.CompletedProcess) -> tuple[list[list[int]], list[str]]:
    """(generated ids per prompt, finish reason per prompt) of a successful run."""
    assert proc.returncode == 0, proc.stderr
    tokens = [[int(t) for t in line.split()] for line in proc.stdout.splitlines()]
    reasons = [line.split("finish_reason=")[1].split()[0]
               for line in proc.stderr.splitlines() if "finish_reason=" in line]
    return tokens, reasons


def cli_options(params: dict, dtype: str = "float32") -> list[str]:
    """Command-line options equivalent to SamplingParams(**params) and LLM(dtype=dtype)."""
    args = ["--dtype", dtype, "--max-model-len", str(MAX_MODEL_LEN)]
    for key, value in params.items():
        if key == "ignore_eos":
            args += ["--ignore-eos"] if value else []
        else:
            args += [FLAGS[key], str(value)]
    return args


def llm_outputs(model_dir: Path, params: dict, dtype: str = "float32",
                prompts=PROMPTS) -> tuple[list[list[int]], list[str], list[int]]:
    """(generated ids, finish reasons, eos ids) from ssd.LLM."""
    with LLM(str(model_dir), max_model_len=MAX_MODEL_LEN, dtype=dtype) as llm:
        outs = llm.generate(prompts, SamplingParams(**params))
        eos = list(llm.model.eos_token_ids)
    return [o.token_ids for o in outs], [o.finish_reason for o in outs], eos


# ------------------------------------------------------------------ parity


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["llama", "llama-sharded", "qwen3-tied"])
def test_program_generates_what_llm_generates(program, models, model, dtype, sampling):
    params = dict(max_tokens=12, **SAMPLINGS[sampling])
    tokens, reasons = program_outputs(run_program(program, str(models[model]), *cli_options(params, dtype)))
    expected_tokens, expected_reasons, _ = llm_outputs(models[model], params, dtype)
    assert tokens == expected_tokens
    assert reasons == expected_reasons == ["length"] * len(PROMPTS)


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_program_runs_sd_like_llm(program, models, sampling):
    """Mode sd: the C++ program and ssd.LLM give the same tokens for the same pair."""
    params = dict(max_tokens=16, **SAMPLINGS[sampling])
    target, draft = models["llama"], models["llama-sharded"]
    args = [str(target), "--mode", "sd", "--draft", str(draft), "--k", "3", *cli_options(params)]
    tokens, reasons = program_outputs(run_program(program, *args))
    with LLM(str(target), draft=str(draft), mode="sd", adaptive=False, k=3, max_model_len=MAX_MODEL_LEN) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(**params))
        assert llm.stats()["rounds"] > 0
    assert tokens == [o.token_ids for o in outs]
    assert reasons == [o.finish_reason for o in outs]


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
def test_program_runs_ssd_like_llm(program, models, sampling):
    """Mode ssd: the C++ program and ssd.LLM give the same tokens for the same pair.

    A fixed fan-out with the neural fallback makes every seeded sample
    independent of cache hits and misses, hence of timing."""
    params = dict(max_tokens=16, **SAMPLINGS[sampling])
    target, draft = models["llama"], models["llama-sharded"]
    args = [str(target), "--mode", "ssd", "--draft", str(draft), "--k", "3", "--fanout", "1,1,1,2",
            "--saguaro-c", "0.5", "--fallback", "neural", "--stats", *cli_options(params)]
    proc = run_program(program, *args)
    tokens, reasons = program_outputs(proc)
    with LLM(str(target), draft=str(draft), mode="ssd", adaptive=False, k=3, fanout=[1, 1, 1, 2], saguaro_c=0.5,
             fallback="neural", max_model_len=MAX_MODEL_LEN) as llm:
        outs = llm.generate(PROMPTS, SamplingParams(**params))
        assert llm.stats()["cache_lookups"] > 0
    assert tokens == [o.token_ids for o in outs]
    assert reasons == [o.finish_reason for o in outs]
    assert "cache_hit_rate=" in proc.stderr and "predicted_speedup=" in proc.stderr


def test_program_logs_its_decisions_when_asked(program, models):
    """--log-level info prints the engine's decisions (here the auto fallback's first choice)."""
    target, draft = models["llama"], models["llama-sharded"]
    args = [str(target), "--mode", "ssd", "--draft", str(draft), "--k", "3", "--fallback", "auto", "--stats",
            "--max-tokens", "24", "--temperature", "0"]
    quiet = run_program(program, *args)
    loud = run_program(program, *args, "--log-level", "info")
    assert quiet.returncode == 0 and loud.returncode == 0, loud.stderr
    assert "ssd: " not in quiet.stderr
    misses = int(loud.stderr.split("fallback_fast=")[1].split()[0])
    assert misses > 0, loud.stderr
    assert "ssd: ssd fallback: fast (n-gram)" in loud.stderr


def test_program_rejects_bad_ssd_options(program, models):
    target, draft = models["llama"], models["llama-sharded"]
    for extra, message in [(["--fanout", "1,x"], "--fanout"), (["--fanout", "1,1"], "fanout: an explicit fan-out"),
                           (["--saguaro-c", "2"], "saguaro_c: must be in [0, 1]"),
                           (["--fallback", "ngram"], "fallback: must be"),
                           (["--fanout-budget", "0"], "--fanout-budget")]:
        proc = run_program(program, str(target), "--mode", "ssd", "--draft", str(draft), "--k", "3", *extra)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_eos_ids_from_generation_config_and_config(program, models, tmp_path):
    model_dir = shutil.copytree(models["llama"], tmp_path / "llama")
    params = dict(temperature=0.0, max_tokens=12)
    (base,), _ = program_outputs(run_program(program, str(model_dir), *cli_options(params), prompts=[[1, 2, 3]]))
    eos = base[4]
    other = next(t for t in range(256) if t not in base)
    generation = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [eos, other]}))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "eos_token_id": other}))

    tokens, reasons = program_outputs(run_program(program, str(model_dir), *cli_options(params), prompts=[[1, 2, 3]]))
    expected_tokens, expected_reasons, eos_ids = llm_outputs(model_dir, params, prompts=[[1, 2, 3]])
    assert eos_ids == [eos, other]
    assert tokens == expected_tokens == [base[: base.index(eos) + 1]]
    assert reasons == expected_reasons == ["stop"]
    ignored = run_program(program, str(model_dir), *cli_options({**params, "ignore_eos": True}), prompts=[[1, 2, 3]])
    assert program_outputs(ignored) == ([base], ["length"])


def test_config_json_with_escapes_and_number_forms_loads(program, models, tmp_path):
    """The JSON reader handles \\u escapes, surrogate pairs, raw UTF-8, exponents, nesting."""
    model_dir = shutil.copytree(models["qwen3-tied"], tmp_path / "qwen3")
    text = json.dumps(json.loads((model_dir / "config.json").read_text()), indent=1)
    assert '"Qwen3ForCausalLM"' in text and '"rms_norm_eps": 1e-06' in text
    text = text.replace('"Qwen3ForCausalLM"', r'"\u0051wen3\u0046orCausalLM"')
    text = text.replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1E-6')
    extras = (r'"note": "\ud83d\ude00 caf\u00e9 \"q\" \\ \/ \b\f\n\r\t ' + "grüße 😀\", "
              '"nested": {"a": [[], {}, -0.5e+2, 0, true, false, null, 12345678901234567890]},\n')
    (model_dir / "config.json").write_text("{" + extras + text[1:], encoding="utf-8")
    options = cli_options(dict(temperature=0.0, max_tokens=8))
    assert (program_outputs(run_program(program, str(model_dir), *options))
            == program_outputs(run_program(program, str(models["qwen3-tied"]), *options)))


def test_program_runs_without_python(program):
    if shutil.which("ldd") is None:
        pytest.skip("needs ldd")
    libs = subprocess.run(["ldd", str(program)], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in libs and "torch_python" not in libs


# ------------------------------------------------------------------ errors


def test_missing_model_dir_fails_with_exit_1(program, tmp_path):
    proc = run_program(program, str(tmp_path / "nowhere"), prompts=[[1]])
    assert proc.returncode == 1
    assert "does not exist" in proc.stderr and str(tmp_path / "nowhere") in proc.stderr


def test_dir_without_config_fails_with_exit_1(program, tmp_path):
    proc = run_program(program, str(tmp_path), prompts=[[1]])
    assert proc.returncode == 1
    assert "has no config.json" in proc.stderr and str(tmp_path) in proc.stderr


def test_unsupported_architecture_fails_with_exit_1(program, models, tmp_path):
    model_dir = shutil.copytree(models["llama"], tmp_path / "gpt2")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "architectures": ["GPT2LMHeadModel"]}))
    proc = run_program(program, str(model_dir), prompts=[[1]])
    assert proc.returncode == 1
    assert "unsupported architecture 'GPT2LMHeadModel'" in proc.stderr
    assert str(model_dir / "config.json") in proc.stderr


CONFIG_DAMAGE = {
    "truncated": lambda t: t[: len(t) // 2],
    "trailing-comma": lambda t: t.rstrip()[:-1] + ",}",
    "single-quotes": lambda t: t.replace('"vocab_size"', "'vocab_size'"),
    "lone-surrogate": lambda t: '{"x": "\\ud800",' + t.lstrip()[1:],
    "bad-escape": lambda t: '{"x": "\\q",' + t.lstrip()[1:],
    "duplicate-key": lambda t: '{"vocab_size": 3,' + t.lstrip()[1:],
    "leading-zero": lambda t: '{"x": 012,' + t.lstrip()[1:],
}


@pytest.mark.parametrize("damage", list(CONFIG_DAMAGE))
def test_malformed_config_json_fails_with_byte_offset(program, models, tmp_path, damage):
    model_dir = shutil.copytree(models["llama"], tmp_path / "llama")
    config = model_dir / "config.json"
    config.write_text(CONFIG_DAMAGE[damage](config.read_text()))
    proc = run_program(program, str(model_dir), prompts=[[1]])
    assert proc.returncode == 1
    assert str(config) in proc.stderr and "malformed JSON" in proc.stderr and "at byte" in proc.stderr


def _rewrite_header(path: Path, mutate) -> None:
    """Rewrites a safetensors file with ``mutate`` applied to its header."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    mutate(header)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data[8 + n:])


def _set(name: str, key: str, value):
    return lambda header: header[name].__setitem__(key, value)


NORM = "model.norm.weight"
FILE_DAMAGE = {
    "truncated-data": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "truncated"),
    "truncated-header": (lambda p: p.write_bytes(p.read_bytes()[:20]), "truncated"),
    "truncated-length": (lambda p: p.write_bytes(p.read_bytes()[:4]), "truncated"),
    "unknown-dtype": (lambda p: _rewrite_header(p, _set(NORM, "dtype", "F7")), f"tensor {NORM}: unknown dtype"),
    "byte-length-mismatch": (lambda p: _rewrite_header(p, _set(NORM, "shape", [3])), f"tensor {NORM}: shape [3]"),
    "offsets-out-of-range": (
        lambda p: _rewrite_header(p, _set(NORM, "data_offsets", [10**9, 10**9 + 256])),
        f"tensor {NORM}: data_offsets"),
}


@pytest.mark.parametrize("damage", list(FILE_DAMAGE))
def test_damaged_safetensors_fails_naming_the_file(program, models, tmp_path, damage):
    model_dir = shutil.copytree(models["llama"], tmp_path / "llama")
    weights = model_dir / "model.safetensors"
    apply, message = FILE_DAMAGE[damage]
    apply(weights)
    proc = run_program(program, str(model_dir), prompts=[[1]])
    assert proc.returncode == 1
    assert str(weights) in proc.stderr and message in proc.stderr


@pytest.mark.parametrize("damage", ["unknown-dtype", "offsets-out-of-range"])
def test_load_and_program_share_one_loader(program, models, tmp_path, damage):
    """ssd.models.load raises, word for word, the error the program prints."""
    model_dir = shutil.copytree(models["llama"], tmp_path / "llama")
    FILE_DAMAGE[damage][0](model_dir / "model.safetensors")
    proc = run_program(program, str(model_dir), prompts=[[1]])
    with pytest.raises(ModelLoadError) as info:
        load(model_dir)
    assert proc.returncode == 1 and f"cannot load model: {info.value}\n" in proc.stderr


def test_missing_shard_fails_naming_it(program, models, tmp_path):
    model_dir = shutil.copytree(models["llama-sharded"], tmp_path / "sharded")
    shard = sorted(model_dir.glob("model-*.safetensors"))[1]
    shard.unlink()
    proc = run_program(program, str(model_dir), prompts=[[1]])
    assert proc.returncode == 1
    assert f"lists shard '{shard.name}'" in proc.stderr


def test_config_that_does_not_fit_the_weights_fails(program, models, tmp_path):
    model_dir = shutil.copytree(models["llama"], tmp_path / "llama")
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "vocab_size": 128}))
    proc = run_program(program, str(model_dir), prompts=[[1]])
    assert proc.returncode == 1
    assert "tensor model.embed_tokens.weight has shape [256, 64], expected [128, 64]" in proc.stderr


BAD_ARGS = {
    "nothing": ([], "missing MODEL_DIR"),
    "no-prompt": (["{model}"], "missing prompt"),
    "unknown-option": (["{model}", "--frobnicate", "1", "--", "1"], "unknown option '--frobnicate'"),
    "not-a-number": (["{model}", "--max-tokens", "ten", "--", "1"], "--max-tokens: expected an integer"),
    "missing-value": (["{model}", "--seed"], "--seed: missing value"),
    "empty-prompt": (["{model}", "--", "1", ",", ",", "2"], "prompt 1 is empty"),
    "trailing-comma": (["{model}", "--", "1", ","], "prompt 1 is empty"),
    "bad-token": (["{model}", "--", "1", "x"], "token id: expected an integer"),
    "negative-temperature": (["{model}", "--temperature", "-1", "--", "1"], "temperature"),
    "bad-dtype": (["{model}", "--dtype", "float16", "--", "1"], "dtype"),
    "token-outside-vocab": (["{model}", "--", "1", "256"], "token id 256 is outside the vocabulary"),
    "exceeds-model-positions": (["{model}", "--max-model-len", "4096", "--", "1"], "max_position_embeddings"),
    "prompt-too-long": (["{model}", "--max-model-len", "4", "--", "1", "2", "3", "4"], "max_model_len"),
    "draft-mode": (["{model}", "--mode", "sd", "--", "1"], "mode"),
    "bad-log-level": (["{model}", "--log-level", "loud", "--", "1"], "--log-level: must be debug, info or warning"),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_bad_arguments_exit_2_with_usage(program, models, case):
    args, message = BAD_ARGS[case]
    argv = [str(program), *(a.replace("{model}", str(models["llama"])) for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "usage: ssd_generate" in proc.stderr


def test_help_exits_0(program):
    proc = subprocess.run([str(program), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: ssd_generate")


# The CPU kernels compiled for AVX2 and AVX-512 (kernels/cpu/isa, CMakeLists.txt) share one library
# with baseline code. A symbol such an object defines outside its own namespace (an inline function
# or template emitted out of line, say std::vector<float>'s) is a weak copy the linker may keep for
# the whole library, and would run AVX instructions on a CPU without them.
ISA_OBJECT_DIRS = {"ssd_kernels_isa1.dir": "avx2", "ssd_kernels_isa2.dir": "avx512",
                   "ssd_kernels_avx512_bf16.dir": "avx512_bf16", "ssd_kernels_avx512_vnni.dir": "avx512_vnni"}


def test_instruction_set_objects_define_only_their_own_symbols(program):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the per-instruction-set objects exist in x86-64 builds only")
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the kernels' object files"
    folder = program.parent / "CMakeFiles"
    for directory, namespace in ISA_OBJECT_DIRS.items():
        objects = sorted((folder / directory).rglob("*.o"))
        assert objects, f"no object files under {folder / directory}"
        for obj in objects:
            out = subprocess.run([nm, "-C", "--defined-only", str(obj)], capture_output=True, text=True, check=True)
            for line in out.stdout.splitlines():
                _, kind, name = line.split(" ", 2)
                if kind.islower() and kind not in "uvw" or name == "DW.ref.__gxx_personality_v0":
                    continue  # local to the object, or the shared reference to the C++ personality routine
                assert f"ssd::kernels::{namespace}::" in name, f"{obj.name} ({namespace}) defines {kind} {name}"
