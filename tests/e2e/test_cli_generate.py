"""`ssd generate` (and `python -m ssd`): its options, its errors (one line, no traceback), and runs in
modes ar, sd and ssd on tiny random models with a tokenizer.

The oracle for the generated text is a greedy loop over transformers' logits of the same checkpoint,
decoded by the `tokenizers` library; sd and ssd at temperature 0 must print the same text as it.
"""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, pre_tokenizers, trainers
from tokenizers import models as tk_models

from ssd import EngineConfig, cli
from tests.reference.tiny_models import TinySpec, build_tiny_model, hf_logits

CORPUS = ["the quick brown fox jumps over the lazy dog", "write a haiku about the sea and the stars",
          "what is the capital of france? paris is.", "User: Assistant: hello there, how are you today"] * 4
TEMPLATE = "{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}Assistant:"
PROMPTS = ["the quick brown fox", "write a haiku about the sea"]
MAX_TOKENS = 8


@dataclass
class TinyModels:
    target: Path
    draft: Path
    target_hf: object
    tokenizer: BackendTokenizer

    def greedy_text(self, prompt: str, n: int = MAX_TOKENS) -> str:
        """transformers' greedy continuation of ``prompt``, decoded by ``tokenizers``."""
        ids = self.tokenizer.encode(prompt).ids
        start = len(ids)
        for _ in range(n):
            ids.append(int(hf_logits(self.target_hf, ids)[-1].argmax()))
        return self.tokenizer.decode(ids[start:]).strip()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TinyModels:
    """A target (2 layers) and a draft (1 layer) sharing a byte-level BPE over ASCII text only (every
    token decodes to whole characters), with a chat template and no end-of-sequence token."""
    root = tmp_path_factory.mktemp("cli_tiny")
    backend = BackendTokenizer(tk_models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, show_progress=False))
    vocab = backend.get_vocab_size()
    target, target_hf = build_tiny_model(TinySpec(vocab_size=vocab, seed=1), root / "target")
    draft, _ = build_tiny_model(TinySpec(vocab_size=vocab, num_layers=1, seed=2), root / "draft")
    for directory in (target, draft):
        backend.save(str(directory / "tokenizer.json"))
        (directory / "tokenizer_config.json").write_text(json.dumps({"chat_template": TEMPLATE}))
    return TinyModels(target, draft, target_hf, backend)


def run_generate(capsys, *argv: str) -> tuple[int, str, str]:
    """``ssd generate ARGV`` in this process: (exit status, stdout, stderr)."""
    try:
        status = cli.main(["generate", *argv])
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def printed_outputs(stdout: str) -> dict[str, tuple[str, int, str]]:
    """{prompt: (text, tokens, finish reason)} from ssd generate's output."""
    found = re.findall(r"^>>> (.*)\n(.*)\n\[(\d+) tokens, (\w+)\]$", stdout, flags=re.M)  # one-line texts
    return {prompt: (text, int(n), reason) for prompt, text, n, reason in found}


def assert_one_line_error(status: int, err: str, expected_status: int, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert status == expected_status and len(lines) == 1, (status, err)
    assert lines[0].startswith("ssd generate: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, err)


# ------------------------------------------------------------------------------------------ options


def test_mode_is_the_mode_not_the_model(capsys, tiny):
    # --mode is read as the mode: an unknown one is the engine config's error, ssd without a draft is too.
    status, _, err = run_generate(capsys, str(tiny.target), "--mode", "fast")
    assert_one_line_error(status, err, 2, "mode")
    status, _, err = run_generate(capsys, str(tiny.target), "--mode", "ssd", "--max-tokens", "2")
    assert_one_line_error(status, err, 2, "draft: mode 'ssd' needs a draft model")
    # --model still names the model; every positional is then a prompt
    status, out, err = run_generate(capsys, "--model", str(tiny.target), PROMPTS[0], "--raw",
                                    "--max-tokens", str(MAX_TOKENS))
    assert status == 0, err
    assert printed_outputs(out)[PROMPTS[0]][0] == tiny.greedy_text(PROMPTS[0])


@pytest.mark.parametrize("argv", [["--mod", "ssd"], ["--max-tok", "4"], ["--temp", "0.5"], ["--dra", "x"]])
def test_abbreviated_options_are_refused(capsys, tiny, argv):
    status, _, err = run_generate(capsys, str(tiny.target), *argv)
    assert_one_line_error(status, err, 2, f"unrecognized arguments: {argv[0]}")


def test_no_command_takes_abbreviations(capsys, tmp_path):
    missing = str(tmp_path / "missing")  # were the option taken, the command would stop at the model
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", missing, "--po", "8001"])
    assert info.value.code == 2 and "unrecognized arguments: --po" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["tokenizer", missing, "--ou", str(tmp_path)])
    assert info.value.code == 2 and "--out" in capsys.readouterr().err  # required, --ou is not it
    with pytest.raises(SystemExit) as info:
        cli.main(["bench", "--quic"])
    assert info.value.code == 2 and "unrecognized arguments: --quic" in capsys.readouterr().err


def test_help_names_the_command_and_every_engine_field(capsys):
    status, out, _ = run_generate(capsys, "--help")
    assert status == 0 and out.startswith("usage: ssd generate ")
    for f in dataclasses.fields(EngineConfig):
        assert f"--{f.name.replace('_', '-')} " in out, f.name
    for option in ("--draft", "--prompt", "--max-tokens", "--temperature", "--top-k", "--top-p", "--seed",
                   "--raw", "--debug"):
        assert option in out, option


# ------------------------------------------------------------------------------------------- errors


def test_errors_are_one_line_without_a_traceback(capsys, tmp_path, tiny):
    missing = tmp_path / "missing-model"
    status, _, err = run_generate(capsys, str(missing), "hello")
    assert_one_line_error(status, err, 2, "does not exist", str(missing))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    status, _, err = run_generate(capsys, str(broken), "hello")
    assert_one_line_error(status, err, 2, str(broken / "config.json"))
    status, _, err = run_generate(capsys, str(tiny.target), "--max-tokens", "many")
    assert_one_line_error(status, err, 2, "--max-tokens", "'many'")
    status, _, err = run_generate(capsys, str(tiny.target), "--temperature", "-1")
    assert_one_line_error(status, err, 2, "temperature")
    status, _, err = run_generate(capsys, str(tiny.target), "--k", "0")
    assert_one_line_error(status, err, 2, "k: must be > 0")
    status, _, err = run_generate(capsys, str(tiny.target), "--adaptive", "maybe")
    assert_one_line_error(status, err, 2, "expected true or false")


def test_serve_and_tokenizer_report_a_bad_model_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    for command in (["serve", "org/absent", "--port", "1"], ["tokenizer", "org/absent", "--out", str(tmp_path)]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert err.startswith(f"ssd {command[0]}: model 'org/absent' not found") and "models--org--absent" in err


def test_debug_shows_the_traceback(tmp_path):
    from ssd.models import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not exist"):
        cli.main(["generate", str(tmp_path / "missing-model"), "--debug"])


# --------------------------------------------------------------------------------------------- runs


def test_ar_prints_the_greedy_text_and_throughput(capsys, tiny):
    status, out, err = run_generate(capsys, str(tiny.target), *PROMPTS, "--raw", "--max-tokens", str(MAX_TOKENS))
    assert status == 0, err
    outputs = printed_outputs(out)
    assert outputs == {p: (tiny.greedy_text(p), MAX_TOKENS, "length") for p in PROMPTS}
    assert re.search(rf"^{2 * MAX_TOKENS} tokens in [\d.]+ s \([\d.]+ tok/s, batch of 2\)$", out, flags=re.M), out
    assert "acceptance" not in out


def test_chat_prompts_go_through_the_template(capsys, tiny):
    status, out, err = run_generate(capsys, str(tiny.target), "--prompt", "hello there", "--max-tokens", "6")
    assert status == 0, err
    assert printed_outputs(out)["hello there"][0] == tiny.greedy_text("User: hello there\nAssistant:", 6)


@pytest.mark.parametrize("mode", ["sd", "ssd"])
def test_speculative_modes_print_the_greedy_text_and_acceptance(capsys, tiny, mode):
    # adaptive off: every round verifies k proposals, so the draft is certain to be used
    status, out, err = run_generate(capsys, str(tiny.target), "--draft", str(tiny.draft), "--mode", mode,
                                    PROMPTS[0], "--prompt", PROMPTS[1], "--raw", "--max-tokens", str(MAX_TOKENS),
                                    "--adaptive", "false", "--k", "3")
    assert status == 0, err
    assert f"with draft draft ({mode})" in out
    assert printed_outputs(out) == {p: (tiny.greedy_text(p), MAX_TOKENS, "length") for p in PROMPTS}
    match = re.search(r"^acceptance ([\d.]+) \((\d+) of (\d+) draft tokens\), [\d.]+ accepted per round", out,
                      flags=re.M)
    assert match, out
    rate, accepted, proposed = float(match[1]), int(match[2]), int(match[3])
    assert proposed > 0 and rate == pytest.approx(accepted / proposed, abs=5e-4)
    assert ("cache hit rate" in out) == (mode == "ssd")


def test_a_draft_equal_to_the_target_is_always_accepted(capsys, tiny):
    status, out, err = run_generate(capsys, str(tiny.target), "--draft", str(tiny.target), "--mode", "sd",
                                    PROMPTS[0], "--raw", "--max-tokens", str(MAX_TOKENS), "--adaptive", "false",
                                    "--draft-matmul-min-rows", "0")
    assert status == 0, err
    match = re.search(r"^acceptance 1\.000 \((\d+) of (\d+) draft tokens\)", out, flags=re.M)
    assert match and match[1] == match[2] != "0", out


def test_models_by_name_from_the_huggingface_cache(capsys, monkeypatch, tmp_path, tiny):
    cache = tmp_path / "hub"
    for name, source in (("org/tiny-target", tiny.target), ("org/tiny-draft", tiny.draft)):
        snapshot = cache / f"models--{name.replace('/', '--')}" / "snapshots" / "c0ffee"
        snapshot.parent.mkdir(parents=True)
        snapshot.symlink_to(source, target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    status, out, err = run_generate(capsys, "org/tiny-target", "--draft", "org/tiny-draft", "--mode", "sd",
                                    PROMPTS[0], "--raw", "--max-tokens", str(MAX_TOKENS))
    assert status == 0, err
    assert printed_outputs(out)[PROMPTS[0]][0] == tiny.greedy_text(PROMPTS[0])
    status, _, err = run_generate(capsys, "org/missing", PROMPTS[0])
    assert_one_line_error(status, err, 2, "models--org--missing", str(cache))


def test_python_dash_m_ssd_runs_ssd_mode(tiny):
    """The one subprocess test: `python -m ssd MODEL --draft DRAFT --mode ssd PROMPT` and its help's name."""
    command = [sys.executable, "-m", "ssd", str(tiny.target), "--draft", str(tiny.draft), "--mode", "ssd",
               PROMPTS[1], "--raw", "--max-tokens", str(MAX_TOKENS)]
    r = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert printed_outputs(r.stdout)[PROMPTS[1]][0] == tiny.greedy_text(PROMPTS[1])
    assert "acceptance" in r.stdout
    r = subprocess.run([sys.executable, "-m", "ssd", "--mod", "ssd"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("python -m ssd: error: unrecognized arguments: --mod")
    assert "Traceback" not in r.stderr
