"""Fixtures shared by all tests: offline mode, a tiny byte-level tokenizer with a chat
template, and an ``HFBackend`` on a tiny random Llama built from a config (no download)."""

from __future__ import annotations

import os
from collections.abc import Callable

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from evoagent.spec.config import BackendConfig  # noqa: E402

pytest_plugins = ["servers"]  # vLLM model, its OpenAI server, a flaky proxy (tests/servers.py)

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "Calculate 12 + 7. Answer: 19",
    "Think step by step. The calculator result is 42.",
    "Action: calculator[3 * 4] Observation: 12 Answer: 12",
    "You are a helpful assistant. Question: What is 95 - 21? Draft answer: 74",
] * 4


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<pad>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama(vocab: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_backend(tiny_tokenizer) -> Callable[..., object]:
    """``tiny_backend(**BackendConfig fields)`` -> an HFBackend on a fresh tiny random Llama."""
    from evoagent.llm.hf import HFBackend

    torch.set_num_threads(2)

    def make(**cfg):
        cfg.setdefault("dtype", "float32")
        model = tiny_llama(len(tiny_tokenizer))
        return HFBackend(BackendConfig(**cfg), model=model, tokenizer=tiny_tokenizer)

    return make


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A tiny random Llama saved as an HF folder: ``policy: {kind: hf, model: <this>}`` runs it."""
    d = tmp_path_factory.mktemp("tiny-model")
    tiny_llama(len(tiny_tokenizer)).save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def snapshot() -> Callable[..., object]:
    """``snapshot(run_dir)`` -> the archive's agents and evaluations, comparable across runs."""
    from evoagent.archive import Archive

    def take(run_dir):
        with Archive(run_dir, write=False) as a:
            agents = sorted((r.id, r.operator, r.parents, r.generation, r.status) for r in a.agents())
            evals = sorted((e.agent_id, e.split, e.stage, e.score, e.n) for e in a.evaluations())
            return agents, evals

    return take
