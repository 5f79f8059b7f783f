"""The trainable policy: a LoRA adapter over the causal LM, and its token logprobs.

Logprobs follow ``rl.batch``'s alignment: ``out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])``
at temperature T, position 0 and padding are 0. The base model under a LoRA adapter is the
reference policy for the KL term, so no second copy of the weights is kept.
"""

from __future__ import annotations

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import Tensor, nn

from evoagent.errors import RLError
from evoagent.rl.config import RLConfig

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_CHUNK = 256  # positions per log_softmax: bounds the float32 copy of the logits to (B, 256, V)


def attach_lora(model: nn.Module, cfg: RLConfig) -> nn.Module:
    """Wrap ``model`` in a fresh LoRA adapter (a PeftModel); with ``full_finetune``, return it.

    Targets the attention and MLP projections of Llama-style models (Hu et al. 2021); lora_B starts
    at 0, so the wrapped model computes exactly what the base did. Raises RLError when the model
    has none of those modules.
    """
    if cfg.full_finetune:
        return model
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(LORA_TARGETS),
        task_type="CAUSAL_LM",
    )
    try:
        return get_peft_model(model, lora)
    except ValueError as e:
        raise RLError(f"cannot attach LoRA to {type(model).__name__}: {e}") from e


def token_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> Tensor:
    """(B, L) float32 log softmax(logits / temperature) of each token given its prefix.

    Differentiable; runs the model in whatever mode it is in. The log softmax is taken in float32
    over chunks of positions, so a bf16 model never materialises float32 logits for all of L.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, L, V)
    b, length = input_ids.shape
    parts = [torch.zeros(b, 1, dtype=torch.float32, device=input_ids.device)]  # position 0
    for s in range(0, length - 1, _CHUNK):
        e = min(s + _CHUNK, length - 1)
        z = logits[:, s:e].float() / temperature  # (B, c, V), predicts tokens s+1..e
        target = input_ids[:, s + 1 : e + 1, None]  # (B, c, 1)
        parts.append(z.gather(-1, target).squeeze(-1) - z.logsumexp(-1))  # (B, c)
    out = torch.cat(parts, dim=1)  # (B, L)
    return torch.where(attention_mask.bool(), out, torch.zeros_like(out))


def reference_logprobs(
    model: nn.Module, input_ids: Tensor, attention_mask: Tensor, temperature: float = 1.0
) -> Tensor:
    """(B, L) detached token logprobs of the base model under ``model``'s LoRA adapter.

    Raises RLError for a model without an adapter: full fine-tuning keeps no reference.
    """
    if not isinstance(model, PeftModel):
        raise RLError("a reference policy needs a LoRA model (full fine-tuning keeps no base copy)")
    with torch.no_grad(), model.disable_adapter():
        return token_logprobs(model, input_ids, attention_mask, temperature)
