"""The trainable policy: a LoRA adapter over the causal LM, and its token logprobs.

Logprobs follow ``rl.batch``'s alignment: ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``
at temperature T, position 0 and padding are 0. The base model under a LoRA adapter is the
reference policy for the KL term, so no second copy of the weights is kept.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from peft import (
    LoraConfig,
    PeftModel,
    get_peft_model,
    get_peft_model_state_dict,
    set_peft_model_state_dict,
)
from torch import Tensor, nn

from evoagent.errors import RLError
from evoagent.execute.executor import request_seed
from evoagent.llm.weights import BASE_ADAPTER, adapter_name, node_adapters
from evoagent.rl.config import RLConfig
from evoagent.rl.packing import additive, pack

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def attach_lora(model: nn.Module, cfg: RLConfig) -> nn.Module:
    """Wrap ``model`` in a fresh LoRA adapter (a PeftModel); with ``full_finetune``, return it.

    Targets the attention and MLP projections of Llama-style models (Hu et al. 2021); lora_B starts
    at 0, so the wrapped model computes exactly what the base did. Raises RLError when the model
    has none of those modules. With ``adapters: per_node`` the one adapter is ``BASE_ADAPTER``,
    never trained (peft wants one to start from); ``add_node_adapters`` adds each node's.
    """
    if cfg.full_finetune:
        return model
    name = BASE_ADAPTER if cfg.per_node else "default"
    try:
        return get_peft_model(model, lora_config(cfg), adapter_name=name)
    except ValueError as e:
        raise RLError(f"cannot attach LoRA to {type(model).__name__}: {e}") from e


def add_node_adapters(model: PeftModel, nodes: Iterable[str], cfg: RLConfig, seed: int) -> list[nn.Parameter]:
    """Give each of ``nodes`` that has none an adapter of its own, in order; return the new
    adapters' parameters. An adapter's lora_B starts at 0 (the node starts from the base
    weights) and its lora_A is drawn from a stream seeded by (``seed``, node), so it is the
    same whichever phase first meets the node."""
    new = [n for n in dict.fromkeys(nodes) if adapter_name(n) not in model.peft_config]
    for node in new:
        with torch.random.fork_rng():
            torch.manual_seed(request_seed(seed, "lora", node) % 2**31)
            model.add_adapter(adapter_name(node), lora_config(cfg))
    names = {adapter_name(n) for n in new}
    return [p for name, p in model.named_parameters() if name.split(".")[-2] in names]


def node_weights(model: PeftModel) -> dict[str, Tensor]:
    """Every node adapter's LoRA state dict in one dict, keys ``"<node>/<peft key>"``, nodes
    in the order they were added (a checkpoint's optimizer state follows that order)."""
    return {f"{node}/{k}": v for node in node_adapters(model) or ()
            for k, v in get_peft_model_state_dict(model, adapter_name=adapter_name(node)).items()}


def by_node(weights: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """``node_weights``'s dict split into one peft state dict per node, in order."""
    out: dict[str, dict[str, Tensor]] = {}
    for key, value in weights.items():
        node, sep, rest = key.partition("/")
        if not sep:
            raise RLError(f"weight {key!r} names no node: these are not per-node adapters")
        out.setdefault(node, {})[rest] = value
    return out


def load_node_weights(model: PeftModel, weights: dict[str, Tensor], cfg: RLConfig) -> list[nn.Parameter]:
    """Load ``node_weights``'s dict into ``model``, adding the adapters it lacks (in the
    dict's order); returns the parameters of the added ones."""
    per_node = by_node(weights)
    added = add_node_adapters(model, per_node, cfg, seed=0)  # their weights are loaded next
    for node, state in per_node.items():
        res = set_peft_model_state_dict(model, state, adapter_name=adapter_name(node))
        unexpected: list[str] = res.unexpected_keys  # type: ignore[attr-defined]
        if unexpected:
            raise RLError(f"adapter of node {node!r} has unknown keys {unexpected[:3]}")
    return added


def lora_config(cfg: RLConfig) -> LoraConfig:
    """The adapter's shape: rank, alpha and target projections from ``cfg``."""
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                      target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")


def load_trained(model: nn.Module, weights: dict[str, Tensor], cfg: RLConfig) -> nn.Module:
    """``model`` (a backend's training copy) carrying trained ``weights`` as a checkpoint holds
    them: a LoRA state dict (the adapter is attached once, then reused) or every weight."""
    if cfg.full_finetune:
        model.load_state_dict(weights)
        return model
    peft = model if isinstance(model, PeftModel) else attach_lora(model, cfg)
    if cfg.per_node:
        load_node_weights(peft, weights, cfg)
    else:
        set_peft_model_state_dict(peft, weights)
    return peft


def base_model(model: nn.Module) -> nn.Module:
    """The transformers model under a LoRA wrapper (the model itself when there is none)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0,
                   wanted: Tensor | None = None) -> Tensor:
    """(B, L) float32 log softmax(logits / temperature) of each token given its prefix.

    ``wanted`` (B, L) marks the tokens whose logprob is needed (the loss mask); the others come
    out 0. Rows that share a prefix (a GRPO group's prompt) are packed so the decoder runs on
    that prefix once (``rl.packing``). The LM head (vocabulary-sized) runs only on
    the positions that predict a wanted token: for a batch of long prompts with short
    completions that is the difference between (B, L, V) float32 logits held for backward,
    gigabytes for a 49k vocabulary, and (tokens, V). Differentiable; runs the model in
    whatever mode it is in. Assumes the causal LM's logits are ``lm_head(last_hidden_state)``
    (true of Llama-style models; not of heads with logit soft-capping).
    """
    base = base_model(model)
    if wanted is None:
        wanted = attention_mask
    wanted = wanted.bool() & attention_mask.bool()
    wanted[:, 0] = False  # position 0 has no prefix to predict it
    rows, cols = wanted.nonzero(as_tuple=True)  # (N,), (N,)
    head = base.get_output_embeddings()
    out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)  # (B, L)
    attention = getattr(base.config, "_attn_implementation", "")
    packed = pack(input_ids, attention_mask, 0, attention) if rows.numel() else None
    if packed is not None:  # rows sharing a prefix run it once (rl.packing)
        mask = packed.attention_mask
        if attention == "eager":
            mask = additive(mask, next(base.parameters()).dtype)
        hidden = base.get_decoder()(
            input_ids=packed.input_ids, attention_mask=mask, position_ids=packed.position_ids
        ).last_hidden_state  # (P, W, H)
        predicting = hidden.flatten(0, 1)[packed.source[rows, cols - 1]]  # (N, H)
    else:
        hidden = base.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask
        ).last_hidden_state  # (B, L, H)
        predicting = hidden[rows, cols - 1]  # (N, H): position t-1 predicts t
    if rows.numel() == 0:
        return out + hidden.sum() * 0.0  # keeps the graph connected for a backward call
    z = head(predicting).float() / temperature  # (N, V)
    picked = z.gather(-1, input_ids[rows, cols, None]).squeeze(-1) - z.logsumexp(-1)  # (N,)
    return out.index_put((rows, cols), picked)


def reference_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0,
                       wanted: Tensor | None = None) -> Tensor:
    """(B, L) detached token logprobs of the base model under ``model``'s LoRA adapter.

    Raises RLError for a model without an adapter: full fine-tuning keeps no reference.
    """
    if not isinstance(model, PeftModel):
        raise RLError("a reference policy needs a LoRA model (full fine-tuning keeps no base copy)")
    with torch.no_grad(), model.disable_adapter():
        return token_logprobs(model, input_ids, attention_mask, temperature, wanted)
