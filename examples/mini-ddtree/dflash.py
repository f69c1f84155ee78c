"""DFlash: the draft proposes one linear block per round, the target verifies it in one forward.

With block_size == 1 there is no draft and this is plain autoregressive decoding (the benchmark's baseline).
"""

import time
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from model import DFlashDraftModel, extract_context_feature, sample

DFLASH_STAGE_ORDER = ("draft", "verify", "commit")


@torch.inference_mode()
def dflash_generate(
    model: DFlashDraftModel,
    target: AutoModelForCausalLM,
    input_ids: torch.Tensor,
    mask_token_id: int,
    max_new_tokens: int,
    block_size: int,
    stop_token_ids: list[int],
    temperature: float = 0.0,
) -> SimpleNamespace:
    device = model.device
    num_input_tokens = input_ids.shape[1]
    max_length = num_input_tokens + max_new_tokens
    use_draft = block_size > 1

    # One spare block past max_length so the last round can write without bounds checks.
    output_ids = torch.full((1, max_length + block_size), mask_token_id, dtype=torch.long, device=device)
    position_ids = torch.arange(output_ids.shape[1], device=device).unsqueeze(0)
    stop_ids = None if stop_token_ids is None else torch.tensor(stop_token_ids, device=device)

    past_key_values_target = DynamicCache()
    past_key_values_draft = DynamicCache()
    stage_times = empty_stage_times(DFLASH_STAGE_ORDER)

    prefill_start = cuda_time()
    output = target(
        input_ids,
        position_ids=position_ids[:, :num_input_tokens],
        past_key_values=past_key_values_target,
        use_cache=True,
        logits_to_keep=1,
        output_hidden_states=use_draft,
    )
    output_ids[:, :num_input_tokens] = input_ids
    output_ids[:, num_input_tokens] = sample(output.logits, temperature)[:, -1]
    context = extract_context_feature(output.hidden_states, model.target_layer_ids) if use_draft else None
    time_to_first_token = cuda_time() - prefill_start

    decode_start = cuda_time()
    clock_start = decode_start
    start = num_input_tokens
    acceptance_lengths: list[int] = []
    round_timestamps: list[float] = []
    first_draft_round = True

    while start < max_length:
        block = output_ids[:, start : start + block_size].clone()
        if use_draft:
            tick = cuda_time()
            draft_hidden = model(
                target_hidden=context,
                noise_embedding=target.model.embed_tokens(block),
                position_ids=position_ids[:, past_key_values_draft.get_seq_length() : start + block_size],
                past_key_values=past_key_values_draft,
                use_cache=True,
                is_causal=False,
            )
            draft_logits = target.lm_head(draft_hidden[:, 1 - block_size :, :])
            past_key_values_draft.crop(start)
            block[:, 1:] = sample(draft_logits)
            elapsed = cuda_time() - tick
            if first_draft_round:
                # The first draft call also prefills the draft cache with the prompt: count it as prefill.
                first_draft_round = False
                decode_start = cuda_time()
            else:
                stage_times["draft"] += elapsed

        tick = cuda_time()
        output = target(
            block,
            position_ids=position_ids[:, start : start + block_size],
            past_key_values=past_key_values_target,
            use_cache=True,
            output_hidden_states=use_draft,
        )
        stage_times["verify"] += cuda_time() - tick

        tick = cuda_time()
        posterior = sample(output.logits, temperature)
        matches = (block[:, 1:] == posterior[:, :-1]).long()
        accepted = int(matches.cumprod(dim=1).sum(dim=1)[0]) if use_draft else 0
        output_ids[:, start : start + accepted + 1] = block[:, : accepted + 1]
        output_ids[:, start + accepted + 1] = posterior[:, accepted]
        acceptance_lengths.append(accepted + 1)
        start += accepted + 1
        past_key_values_target.crop(start)
        if use_draft:
            context = extract_context_feature(output.hidden_states, model.target_layer_ids)[:, : accepted + 1, :]
        stage_times["commit"] += cuda_time() - tick
        round_timestamps.append(cuda_time() - clock_start)

        if stop_ids is not None and torch.isin(output_ids[0, start - accepted - 1 : start + 1], stop_ids).any():
            break

    output_ids = trim_output(output_ids, max_length, num_input_tokens, mask_token_id, stop_ids)
    num_output_tokens = output_ids.shape[1] - num_input_tokens
    time_per_output_token = (cuda_time() - decode_start) / max(num_output_tokens, 1)

    return SimpleNamespace(
        output_ids=output_ids.cpu(),
        num_input_tokens=num_input_tokens,
        num_output_tokens=num_output_tokens,
        time_to_first_token=time_to_first_token,
        time_per_output_token=time_per_output_token,
        acceptance_lengths=acceptance_lengths,
        decode_rounds=len(acceptance_lengths),
        stage_times=stage_times,
        round_timestamps=round_timestamps,
    )


def trim_output(output_ids, max_length, num_input_tokens, mask_token_id, stop_ids):
    """Drop the spare tail and unfilled slots, and cut after the first stop token in the generated part."""
    output_ids = output_ids[:, :max_length]
    output_ids = output_ids[:, output_ids[0] != mask_token_id]
    if stop_ids is not None:
        hits = torch.isin(output_ids[0, num_input_tokens:], stop_ids).nonzero(as_tuple=True)[0]
        if hits.numel() > 0:
            output_ids = output_ids[:, : num_input_tokens + int(hits[0]) + 1]
    return output_ids


def cuda_time() -> float:
    torch.cuda.synchronize()
    return time.perf_counter()


def empty_stage_times(stage_names: tuple[str, ...]) -> dict[str, float]:
    return dict.fromkeys(stage_names, 0.0)
