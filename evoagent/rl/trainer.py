"""One optimizer step of policy-gradient training on a TokenBatch, and exact checkpoints.

Departures from PPO/GRPO as usually written (TRL, verl):

- Single epoch, on-policy: every batch is trained once, right after it was sampled by the weights
  being trained, so pi_old is the current policy itself: ``old_logp = logp.detach()`` and the
  ratio is 1 in value (the clip loss reduces to the policy gradient). The rollout logprobs the
  backend reported enter as ``rollout_logp``, so with ``tis_cap`` the truncated importance weight
  min(pi_old / pi_rollout, C) corrects the numerical mismatch between the inference backend and
  the trainer (bf16 vs fp32, batching; Yao et al. 2025).
- Memory is bounded by ``micro_batch_tokens`` (rows sorted by length, cut into chunks of at
  most that many padded tokens) and by gradient checkpointing; only completion positions go
  through the LM head (``policy.token_logprobs``).
- Gradient accumulation is exact for the registered aggregations: each micro-batch's loss is
  scaled by its share of the full batch's aggregation weights, obtained by differentiating the
  aggregation itself (it is linear in the per-token loss), so no aggregation is special-cased.
- ``train_pairs`` is the DPO step (preference pairs of whole episodes); it is exact under
  micro-batching too (see its docstring).
- The learning-rate schedule is transformers' (``rl.lr_schedule``); its state is checkpointed
  with the optimizer's, so a resumed run continues on the same curve.
- On CPU, with gradient checkpointing, attention runs eagerly (softmax(QK^T)V as matmuls):
  torch's CPU flash-attention kernel with an explicit mask (padding, or ``rl.packing``'s
  block mask) is the slower one here, most of all in backward (one GRPO step of the
  ``bench/rl_step.py`` shape: 3.37 s with sdpa, 3.03 s eager). Eager attention holds one
  layer's (B, H, L, L) weights at a time, which checkpointing bounds; without it, sdpa stays.
- ``rl.adapters: per_node``: each node id gets its own LoRA adapter, added when a batch first
  brings that node's tokens (its parameters join the optimizer's one group, so the schedule
  covers them); rows are grouped by node and each micro-batch runs under its node's adapter,
  so a node's tokens train only its adapter while the step's gradients accumulate together.
- The trainer owns its torch RNG stream (dropout): each step runs under ``fork_rng`` from a state
  seeded by ``seed`` and saved in checkpoints, so training neither reads nor disturbs the
  process-wide RNG, and a resumed trainer continues bit for bit.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from pathlib import Path

import torch
from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict
from torch import Tensor, nn

from evoagent.errors import RLError
from evoagent.heap import release_memory
from evoagent.llm.hardware import native_bf16
from evoagent.llm.weights import adapter_name
from evoagent.rl.batch import TokenBatch
from evoagent.rl.config import RLConfig
from evoagent.rl.losses import LossConfig, LossInputs, dpo, get_aggregation, get_policy_loss
from evoagent.rl.policy import (
    add_node_adapters,
    base_model,
    load_node_weights,
    node_weights,
    reference_logprobs,
    token_logprobs,
)

CHECKPOINT_FORMAT = 2  # 2: + scheduler state


class Trainer:
    """AdamW on the trainable parameters of a policy from ``policy.attach_lora``.

    Not thread-safe; the model must not be used for generation during ``train_step``.
    """

    def __init__(self, model: nn.Module, cfg: RLConfig, pad_id: int, seed: int) -> None:
        if not cfg.full_finetune and not isinstance(model, PeftModel):
            raise RLError("RLConfig.full_finetune is false but the model has no LoRA adapter")
        self.model = model
        self.cfg = cfg
        if cfg.gradient_checkpointing:
            base = base_model(model)
            # Non-reentrant checkpointing needs no input that requires grad (LoRA's case).
            # transformers 5 renamed gradient_checkpointing_enable (kept as a deprecated alias).
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable({"use_reentrant": False})
            else:
                base.gradient_checkpointing_enable({"use_reentrant": False})
            if next(base.parameters()).device.type == "cpu" and hasattr(base, "set_attn_implementation"):
                base.set_attn_implementation("eager")  # see the module docstring
        self.pad_id = pad_id
        self.seed = seed
        self.step = 0
        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise RLError("the model has no trainable parameters")
        self._device = self._params[0].device
        self.optimizer = torch.optim.AdamW(self._params, lr=cfg.lr)
        self.scheduler = _scheduler(self.optimizer, cfg)
        self._loss = get_policy_loss(cfg.policy_loss)
        self._loss_cfg = cfg.loss_config()
        self._rng: dict[str, Tensor] = {"cpu": torch.Generator().manual_seed(seed).get_state()}
        if self._device.type == "cuda":
            gen = torch.Generator(self._device).manual_seed(seed)
            self._rng["cuda"] = gen.get_state()

    # ------------------------------------------------------------------ training

    def train_step(self, batch: TokenBatch) -> dict[str, float]:
        """One optimizer step on ``batch``; returns loss, grad_norm, tokens, rows and loss metrics.

        Raises RLError for a batch without trained tokens or a non-finite gradient (the weights are
        left untouched then).
        """
        batch, micro = self._begin(batch)
        tokens = batch.tokens
        scales = self._micro_scales(batch, micro)
        total = 0.0
        sums: dict[str, float] = {}
        with torch.random.fork_rng(devices=self._rng_devices()), self._autocast():
            self._set_rng(self._rng)
            for mb, scale in zip(micro, scales):
                self._use(mb)
                out = self._loss(self._inputs(mb), self._loss_cfg)
                (out.loss * scale).backward()
                total += float(out.loss.detach()) * scale
                for k, v in out.metrics.items():
                    sums[k] = sums.get(k, 0.0) + v * mb.tokens
            self._rng = self._get_rng()
        grad_norm = self._apply(total)
        metrics = {k: v / tokens for k, v in sums.items()}
        metrics.update(
            loss=total, grad_norm=grad_norm, tokens=float(tokens), rows=float(batch.rows)
        )
        return metrics

    def train_pairs(self, batch: TokenBatch, chosen: Tensor, rejected: Tensor) -> dict[str, float]:
        """One DPO step on preference pairs: ``chosen[i]`` and ``rejected[i]`` are episode ids
        (``batch.episode`` values); an episode's logprob is the sum over all its rows' trained
        tokens. The reference is the base model (LoRA adapter disabled).

        Exact under any micro-batching although the loss is not linear in the tokens: a first
        pass without gradients computes every episode's logprob (policy and reference), the loss
        gives d loss / d episode-logprob, and a second pass backpropagates each micro-batch's
        rows weighted by their episode's coefficient. It costs one extra forward pass.
        """
        batch, micro = self._begin(batch)
        n_ep = int(batch.episode.max()) + 1
        t = self.cfg.temperature
        with torch.random.fork_rng(devices=self._rng_devices()), self._autocast():
            self._set_rng(self._rng)
            policy = torch.zeros(n_ep, device=self._device)  # (E,)
            ref = torch.zeros(n_ep, device=self._device)  # (E,)
            with torch.no_grad():
                for mb in micro:
                    self._use(mb)
                    args = (mb.input_ids, mb.attention_mask, t, mb.loss_mask)
                    policy.index_add_(0, mb.episode, _row_sums(token_logprobs(self.model, *args), mb))
                    ref.index_add_(0, mb.episode, _row_sums(reference_logprobs(self.model, *args), mb))
            leaf = policy.clone().requires_grad_(True)
            out = dpo(leaf[chosen], leaf[rejected], ref[chosen], ref[rejected], self.cfg.dpo_beta)
            (coeff,) = torch.autograd.grad(out.loss, leaf)  # (E,) d loss / d episode logprob
            for mb in micro:
                self._use(mb)
                logp = token_logprobs(self.model, mb.input_ids, mb.attention_mask, t, mb.loss_mask)
                (_row_sums(logp, mb) * coeff[mb.episode]).sum().backward()
            self._rng = self._get_rng()
        total = float(out.loss.detach())
        grad_norm = self._apply(total)
        return {
            **out.metrics, "loss": total, "grad_norm": grad_norm, "pairs": float(len(chosen)),
            "tokens": float(batch.tokens), "rows": float(batch.rows),
        }

    def _begin(self, batch: TokenBatch) -> tuple[TokenBatch, list[TokenBatch]]:
        """The batch on the device, shortest rows first, and its micro-batches; the model in
        train mode with no gradient left over. Raises RLError for a batch with nothing to train."""
        batch = batch.to(self._device)
        if batch.tokens == 0:
            raise RLError("batch has no trained tokens")
        per_node = self.cfg.per_node
        if per_node:
            if len(batch.node) != batch.rows:
                raise RLError("rl.adapters per_node: the batch does not say which node each row comes from")
            self._add_params(add_node_adapters(self.model, batch.node, self.cfg, self.seed))
        batch = batch.by_length(by_node=per_node)
        micro = batch.split_tokens(self.cfg.micro_batch_tokens, at_least=self.cfg.grad_accum, by_node=per_node)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        return batch, micro

    def _use(self, mb: TokenBatch) -> None:
        """Per node: run ``mb`` (one node's rows) under that node's adapter."""
        if self.cfg.per_node:
            self.model.set_adapter(adapter_name(mb.node[0]))

    def _add_params(self, params: list[nn.Parameter]) -> None:
        """A new node adapter's parameters join the optimizer (its one group: the schedule's)."""
        self._params += params
        self.optimizer.param_groups[0]["params"].extend(params)

    def drop_adapters(self, keep: set[str]) -> None:
        """Per node: delete every adapter not in ``keep`` with its parameters' optimizer state,
        so a checkpoint saved when only ``keep`` existed loads exactly (a rollback)."""
        model = self.model
        if not self.cfg.per_node or not isinstance(model, PeftModel):
            return
        for name in [n for n in model.peft_config if n not in keep]:
            gone = {id(p) for n, p in model.named_parameters() if n.split(".")[-2] == name}
            model.delete_adapter(name)
            for p in [p for p in self._params if id(p) in gone]:
                self.optimizer.state.pop(p, None)
            self._params = [p for p in self._params if id(p) not in gone]
            self.optimizer.param_groups[0]["params"] = list(self._params)

    def _apply(self, loss: float) -> float:
        """Clip the accumulated gradients and take the optimizer and scheduler step; return the
        gradient norm. A non-finite loss or norm drops the gradients instead (RLError), so the
        weights are left untouched."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.cfg.max_grad_norm))
        if not math.isfinite(grad_norm) or not math.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise RLError(f"non-finite loss {loss} or grad norm {grad_norm}; step skipped")
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        release_memory()
        self.step += 1
        return grad_norm

    def _inputs(self, mb: TokenBatch) -> LossInputs:
        """LossInputs of one micro-batch (see the module docstring for old vs rollout logp)."""
        t = self.cfg.temperature
        logp = token_logprobs(self.model, mb.input_ids, mb.attention_mask, t, mb.loss_mask)  # (b, l)
        ref = None
        if self.cfg.kl_beta > 0:
            ref = reference_logprobs(self.model, mb.input_ids, mb.attention_mask, t, mb.loss_mask)
        return LossInputs(
            logp=logp,
            old_logp=logp.detach(),
            advantages=mb.advantages,
            mask=mb.loss_mask,
            ref_logp=ref,
            rollout_logp=mb.old_logp,
        )

    def _micro_scales(self, batch: TokenBatch, micro: list[TokenBatch]) -> list[float]:
        """Weight of each micro-batch loss so that their sum is the full batch's loss."""
        if len(micro) == 1:
            return [1.0]
        full = _agg_weights(batch.loss_mask, self._loss_cfg)  # (B, L)
        scales, row = [], 0
        for mb in micro:
            own = float(_agg_weights(mb.loss_mask, self._loss_cfg).sum())
            share = float(full[row : row + mb.rows].sum())
            scales.append(share / own if own else 0.0)
            row += mb.rows
        return scales

    def _autocast(self) -> contextlib.AbstractContextManager[object]:
        """bf16 autocast of the forward passes on a CUDA device that supports it (optimizer
        state and loss stay fp32); on CPU the policy's own dtype (``policy.dtype``) decides."""
        if self.cfg.autocast and self._device.type == "cuda" and native_bf16("cuda"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: Path) -> None:
        """Write trainable weights, optimizer, scheduler, step and RNG to ``path`` atomically."""
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "weights": self.weights(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self._rng,
        }
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(state, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # disk full, quota, read-only: torch says RuntimeError
            tmp.unlink(missing_ok=True)
            raise RLError(
                f"cannot write checkpoint {path}: {e}. The archive still ends at the last "
                "finished generation: free space and continue with --resume"
            ) from e

    def load_checkpoint(self, path: Path) -> None:
        """Restore what ``save_checkpoint`` wrote; raises RLError if it does not fit this model."""
        try:
            state = torch.load(Path(path), map_location=self._device, weights_only=True)
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:
            raise RLError(f"cannot read checkpoint {path}: {e}") from e
        if not isinstance(state, dict) or state.get("format") not in (1, CHECKPOINT_FORMAT):
            raise RLError(f"{path} is not a format-{CHECKPOINT_FORMAT} trainer checkpoint")
        try:
            if self.cfg.per_node:  # adapters in the order they were added: the optimizer's order
                self._add_params(load_node_weights(self.model, state["weights"], self.cfg))
            elif isinstance(self.model, PeftModel):
                res = set_peft_model_state_dict(self.model, state["weights"])
                # peft annotates the result as a bare namedtuple; it is torch's _IncompatibleKeys
                unexpected: list[str] = res.unexpected_keys  # type: ignore[attr-defined]
                if unexpected:
                    raise RLError(f"checkpoint has unknown adapter keys {unexpected[:3]}")
            else:
                self.model.load_state_dict(state["weights"], strict=True)
            self.optimizer.load_state_dict(state["optimizer"])
            if "scheduler" in state:
                self.scheduler.load_state_dict(state["scheduler"])
            else:  # format 1 predates schedules: it was trained at a constant lr
                self.scheduler.last_epoch = int(state["step"])
        except (RuntimeError, ValueError, KeyError) as e:
            raise RLError(f"checkpoint {path} does not fit this model: {e}") from e
        self.step = int(state["step"])
        self._rng = {k: v.cpu() for k, v in state["rng"].items()}

    def weights(self) -> dict[str, Tensor]:
        """The trainable weights: the LoRA state dict (per node: ``policy.node_weights``), or
        with full fine-tuning every weight."""
        if self.cfg.per_node:
            return node_weights(self.model)
        if isinstance(self.model, PeftModel):
            return get_peft_model_state_dict(self.model)
        return self.model.state_dict()

    # ------------------------------------------------------------------ rng

    def _rng_devices(self) -> list[int]:
        return [self._device.index or 0] if self._device.type == "cuda" else []

    def _get_rng(self) -> dict[str, Tensor]:
        state = {"cpu": torch.get_rng_state()}
        if self._device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self._device)
        return state

    def _set_rng(self, state: dict[str, Tensor]) -> None:
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self._device)


def _agg_weights(mask: Tensor, cfg: LossConfig) -> Tensor:
    """(B, L) d aggregation / d per-token loss: the weight each token has in the batch loss."""
    x = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device, requires_grad=True)
    with torch.enable_grad():
        (g,) = torch.autograd.grad(get_aggregation(cfg.agg)(x, mask, cfg), x, allow_unused=True)
    return torch.zeros_like(x) if g is None else g


def _row_sums(logp: Tensor, mb: TokenBatch) -> Tensor:
    """(b,) each row's summed logprob over its trained tokens."""
    return (logp * mb.loss_mask).sum(dim=1)


def _scheduler(optimizer: torch.optim.Optimizer, cfg: RLConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """transformers' schedule named by ``cfg.lr_schedule`` (state saved in checkpoints)."""
    from transformers import get_scheduler

    name = "constant_with_warmup" if cfg.lr_schedule == "constant" else cfg.lr_schedule
    return get_scheduler(
        name, optimizer, num_warmup_steps=cfg.warmup_steps, num_training_steps=cfg.schedule_steps
    )
