"""A tiny block-diffusion draft model with the DFlash interface.

The draft never owns an embedding or an LM head: it reads the target's token embeddings for the block being drafted
(the "noise" block: the last accepted token followed by mask tokens) and the target's hidden states for the accepted
context, and returns hidden states that the caller turns into logits with the target's own `lm_head`.
Each draft layer attends, without a causal mask, from the block to [context features, block]; its key/value cache
grows by the context that was accepted since the previous round.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, Qwen3Config
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3PreTrainedModel,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
)

from .utils import build_target_layer_ids, extract_context_feature, sample


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DraftBlockAttention(nn.Module):
    """Queries from the block; keys and values from the context features and the block, cached across rounds."""

    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim or config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, block, context, cos, sin, past_key_values=None):
        batch, block_len, _ = block.shape
        kv_input = torch.cat([context, block], dim=1)
        kv_len = kv_input.shape[1]
        q = self.q_norm(self.q_proj(block).view(batch, block_len, -1, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv_input).view(batch, kv_len, -1, self.head_dim)).transpose(1, 2)
        v = self.v_proj(kv_input).view(batch, kv_len, -1, self.head_dim).transpose(1, 2)
        # cos/sin cover the context and the block; the queries are the block, i.e. the trailing positions.
        q = _rotate(q, cos[:, None, -block_len:], sin[:, None, -block_len:])
        k = _rotate(k, cos[:, None], sin[:, None])
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)

        implementation = self.config._attn_implementation
        if implementation in (None, "eager", "sdpa"):
            groups = self.num_heads // self.num_kv_heads
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=False, scale=self.scaling).transpose(1, 2)
        else:  # e.g. flash_attention_2 on a GPU host: the library kernels take [batch, heads, seq, dim]
            out, _ = ALL_ATTENTION_FUNCTIONS[implementation](
                self, q, k, v, None, dropout=0.0, scaling=self.scaling, is_causal=False
            )
        return self.o_proj(out.reshape(batch, block_len, -1))


class DraftLayer(nn.Module):
    def __init__(self, config: Qwen3Config, layer_idx: int):
        super().__init__()
        self.attn = DraftBlockAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden, context, cos, sin, past_key_values=None):
        hidden = hidden + self.attn(self.input_layernorm(hidden), context, cos, sin, past_key_values)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashDraftModel(Qwen3PreTrainedModel):
    """Draft for a target with `num_target_layers` layers; config carries `block_size` and `dflash_config`."""

    config_class = Qwen3Config
    _no_split_modules = ["DraftLayer"]

    def __init__(self, config: Qwen3Config):
        super().__init__(config)
        dflash_config = getattr(config, "dflash_config", None) or {}
        self.target_layer_ids = list(
            dflash_config.get("target_layer_ids")
            or build_target_layer_ids(config.num_target_layers, config.num_hidden_layers)
        )
        self.mask_token_id = dflash_config.get("mask_token_id")
        self.block_size = config.block_size
        self.fc = nn.Linear(len(self.target_layer_ids) * config.hidden_size, config.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.post_init()

    def forward(
        self,
        position_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        noise_embedding: torch.Tensor | None = None,
        target_hidden: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        **kwargs,
    ) -> torch.Tensor:
        """Hidden states for the block: position_ids span the new context followed by the block."""
        context = self.hidden_norm(self.fc(target_hidden))
        hidden_states = noise_embedding
        cos, sin = self.rotary_emb(hidden_states, position_ids)
        cache = past_key_values if use_cache else None
        for layer in self.layers:
            hidden_states = layer(hidden_states, context, cos, sin, cache)
        return self.norm(hidden_states)

    @torch.inference_mode()
    def spec_generate(
        self,
        target: nn.Module,
        input_ids: torch.LongTensor,
        max_new_tokens: int,
        stop_token_ids: list[int],
        temperature: float,
    ) -> torch.LongTensor:
        """Self-contained DFlash decoding (not used by benchmark.py, which calls dflash.dflash_generate)."""
        self.eval()
        num_input_tokens = input_ids.shape[1]
        max_length = num_input_tokens + max_new_tokens
        block_size = self.block_size
        output_ids = torch.full(
            (1, max_length + block_size), self.mask_token_id, dtype=torch.long, device=target.device
        )
        position_ids = torch.arange(output_ids.shape[1], device=target.device).unsqueeze(0)
        stop_ids = None if stop_token_ids is None else torch.tensor(stop_token_ids, device=target.device)

        past_key_values_target = DynamicCache()
        past_key_values_draft = DynamicCache()

        output = target(
            input_ids,
            position_ids=position_ids[:, :num_input_tokens],
            past_key_values=past_key_values_target,
            use_cache=True,
            logits_to_keep=1,
            output_hidden_states=True,
        )
        output_ids[:, :num_input_tokens] = input_ids
        output_ids[:, num_input_tokens] = sample(output.logits, temperature)[:, -1]
        context = extract_context_feature(output.hidden_states, self.target_layer_ids)

        start = num_input_tokens
        while start < max_length:
            block = output_ids[:, start : start + block_size].clone()
            draft_hidden = self(
                target_hidden=context,
                noise_embedding=target.model.embed_tokens(block),
                position_ids=position_ids[:, past_key_values_draft.get_seq_length() : start + block_size],
                past_key_values=past_key_values_draft,
                use_cache=True,
                is_causal=False,
            )
            past_key_values_draft.crop(start)
            block[:, 1:] = sample(target.lm_head(draft_hidden[:, 1 - block_size :, :]))

            output = target(
                block,
                position_ids=position_ids[:, start : start + block_size],
                past_key_values=past_key_values_target,
                use_cache=True,
                output_hidden_states=True,
            )
            posterior = sample(output.logits, temperature)
            accepted = int((block[:, 1:] == posterior[:, :-1]).long().cumprod(dim=1).sum())
            output_ids[:, start : start + accepted + 1] = block[:, : accepted + 1]
            output_ids[:, start + accepted + 1] = posterior[:, accepted]
            start += accepted + 1
            past_key_values_target.crop(start)
            context = extract_context_feature(output.hidden_states, self.target_layer_ids)[:, : accepted + 1, :]
            if stop_ids is not None and torch.isin(output_ids[0, num_input_tokens : start + 1], stop_ids).any():
                break

        output_ids = output_ids[:, :max_length]
        output_ids = output_ids[:, output_ids[0] != self.mask_token_id]
        if stop_ids is not None:
            hits = torch.isin(output_ids[0, num_input_tokens:], stop_ids).nonzero(as_tuple=True)[0]
            if hits.numel() > 0:
                output_ids = output_ids[:, : num_input_tokens + int(hits[0]) + 1]
        return output_ids
