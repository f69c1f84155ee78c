"""DDTree: the draft's per-position distributions span a tree of continuations; the target verifies the whole tree in
one forward under a tree attention mask and the longest path that agrees with the target is accepted.

Tree construction is best-first over paths: a path's score is the sum of the draft log-probabilities of its tokens,
where depth d of the path uses the draft's distribution for block position d. Popping the best path adds one node;
it then offers its next sibling (next rank at the same depth) and its first child (top rank one level deeper).
"""

import heapq
import time
from types import SimpleNamespace

import torch
from transformers import AutoModelForCausalLM, DynamicCache

from dflash import cuda_time, dflash_generate, empty_stage_times, trim_output
from model import DFlashDraftModel, extract_context_feature, sample

DDTREE_STAGE_ORDER = ("draft", "tree_build", "tree_compile", "verify", "commit")
DDTREE_TREE_BUILD_STAGE_ORDER = ("tree_build_copy", "tree_build_heap", "tree_build_visibility")

_CPP_COMPACT_ENABLED = False


def maybe_enable_cpp_compact(enabled: bool) -> None:
    """Accepted for interface parity; the mini repo always compacts the cache in Python."""
    global _CPP_COMPACT_ENABLED
    _CPP_COMPACT_ENABLED = enabled


def build_ddtree_tree(draft_logits: torch.Tensor, budget: int):
    """Best-first tree of at most `budget` nodes from [depth, vocab] draft logits.

    Returns (node_token_ids, node_depths, parents, child_maps, visibility, subtimes); node 0 is the root (the token
    already known), nodes 1..n are drafted, parents[i] < i, child_maps[i] maps token id -> child node index, and
    visibility[i, j] says whether node i may attend to node j (j is i or an ancestor of i).
    """
    subtimes = empty_stage_times(DDTREE_TREE_BUILD_STAGE_ORDER)
    depth_limit = int(draft_logits.shape[0])
    if budget <= 0 or depth_limit == 0:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty.clone(), [-1], [{}], torch.ones((1, 1), dtype=torch.bool), subtimes

    tick = cuda_time()
    width = min(budget, draft_logits.shape[-1])
    log_probs = torch.log_softmax(draft_logits.float(), dim=-1)
    top_log_probs, top_ids = log_probs.topk(width, dim=-1)
    top_log_probs, top_ids = top_log_probs.cpu().tolist(), top_ids.cpu().tolist()
    subtimes["tree_build_copy"] = cuda_time() - tick

    tick = time.perf_counter()
    token_ids: list[int] = []
    depths: list[int] = []
    parents = [-1]
    child_maps: list[dict[int, int]] = [{}]
    # Entries: (-score, tie_breaker, parent node, depth, rank at that depth, score).
    frontier = [(-top_log_probs[0][0], 0, 0, 1, 0, top_log_probs[0][0])]
    pushes = 1
    while frontier and len(token_ids) < budget:
        _, _, parent, depth, rank, score = heapq.heappop(frontier)
        token = top_ids[depth - 1][rank]
        node = len(token_ids) + 1
        token_ids.append(token)
        depths.append(depth)
        parents.append(parent)
        child_maps.append({})
        child_maps[parent][token] = node
        if rank + 1 < width:
            sibling = score - top_log_probs[depth - 1][rank] + top_log_probs[depth - 1][rank + 1]
            heapq.heappush(frontier, (-sibling, pushes, parent, depth, rank + 1, sibling))
            pushes += 1
        if depth < depth_limit:
            child = score + top_log_probs[depth][0]
            heapq.heappush(frontier, (-child, pushes, node, depth + 1, 0, child))
            pushes += 1
    subtimes["tree_build_heap"] = time.perf_counter() - tick

    tick = time.perf_counter()
    size = len(parents)
    visibility = torch.zeros((size, size), dtype=torch.bool)
    visibility[0, 0] = True
    for node in range(1, size):
        visibility[node] = visibility[parents[node]]
        visibility[node, node] = True
    subtimes["tree_build_visibility"] = time.perf_counter() - tick

    node_token_ids = torch.tensor(token_ids, dtype=torch.long)
    node_depths = torch.tensor(depths, dtype=torch.long)
    return node_token_ids, node_depths, parents, child_maps, visibility, subtimes


def compile_ddtree_tree(root_token_id, start, node_token_ids, node_depths, visibility, past_length, dtype, device):
    """Verifier inputs for the tree: ids [root, nodes], positions start + depth, and a 4D additive mask."""
    size = 1 + int(node_token_ids.numel())
    verify_input_ids = torch.cat([root_token_id.reshape(1), node_token_ids.to(device)]).unsqueeze(0)
    verify_position_ids = torch.cat(
        [torch.zeros(1, dtype=torch.long), node_depths]
    ).to(device).unsqueeze(0) + start
    mask = torch.zeros((1, 1, size, past_length + size), dtype=dtype, device=device)
    mask[0, 0, :, past_length:].masked_fill_(~visibility.to(device), torch.finfo(dtype).min)
    return verify_input_ids, verify_position_ids, mask


def follow_verified_tree(child_maps: list[dict[int, int]], posterior: torch.Tensor) -> tuple[list[int], int]:
    """Walk from the root while the target's choice at a node is one of its children; return path and bonus token."""
    choices = posterior[0].tolist()
    path = [0]
    while choices[path[-1]] in child_maps[path[-1]]:
        path.append(child_maps[path[-1]][choices[path[-1]]])
    return path, int(choices[path[-1]])


def _keep_rows(tensor: torch.Tensor, past_length: int, keep: torch.Tensor) -> None:
    """Move the kept rows of the window appended after past_length to its front, in place."""
    window = tensor.shape[-2] - past_length
    if window <= 0 or keep.numel() in (0, window):
        return
    kept = tensor.narrow(-2, past_length, window).index_select(-2, keep)
    tensor.narrow(-2, past_length, keep.numel()).copy_(kept)


def compact_dynamic_cache(past_key_values: DynamicCache, past_length: int, keep_current_indices: list[int]) -> None:
    """Keep only the accepted tree nodes' keys/values after past_length, then shorten the cache to match."""
    if not keep_current_indices:
        past_key_values.crop(past_length)
        return

    keep_by_device: dict[torch.device, torch.Tensor] = {}

    def keep_on(device: torch.device) -> torch.Tensor:
        if device not in keep_by_device:
            keep_by_device[device] = torch.tensor(keep_current_indices, dtype=torch.long, device=device)
        return keep_by_device[device]

    if hasattr(past_key_values, "key_cache") and hasattr(past_key_values, "value_cache"):  # transformers 4.x layout
        for keys, values in zip(past_key_values.key_cache, past_key_values.value_cache):
            _keep_rows(keys, past_length, keep_on(keys.device))
            _keep_rows(values, past_length, keep_on(values.device))
        past_key_values.crop(past_length + len(keep_current_indices))
        return

    if hasattr(past_key_values, "layers"):
        for layer in past_key_values.layers:
            keys = getattr(layer, "keys", None)  # linear-attention layers have no keys/values to compact
            if keys is None or keys.numel() == 0:
                continue
            _keep_rows(keys, past_length, keep_on(keys.device))
            _keep_rows(layer.values, past_length, keep_on(keys.device))
        past_key_values.crop(past_length + len(keep_current_indices))
        return

    raise RuntimeError(f"cannot compact a {type(past_key_values).__name__}: unknown cache layout")


@torch.inference_mode()
def ddtree_generate(
    model: DFlashDraftModel,
    target: AutoModelForCausalLM,
    input_ids: torch.Tensor,
    mask_token_id: int,
    max_new_tokens: int,
    block_size: int,
    stop_token_ids: list[int],
    temperature: float = 0.0,
    tree_budget: int | None = None,
    save_tree_traces: bool = False,
) -> SimpleNamespace:
    if block_size <= 1:
        return dflash_generate(
            model=model,
            target=target,
            input_ids=input_ids,
            mask_token_id=mask_token_id,
            max_new_tokens=max_new_tokens,
            block_size=block_size,
            stop_token_ids=stop_token_ids,
            temperature=temperature,
        )

    device = model.device
    num_input_tokens = input_ids.shape[1]
    max_length = num_input_tokens + max_new_tokens
    horizon = block_size - 1
    tree_budget = horizon if tree_budget is None else max(tree_budget, 0)

    # Room for the largest tree past max_length, so the last round writes without bounds checks.
    output_ids = torch.full((1, max_length + 1 + tree_budget), mask_token_id, dtype=torch.long, device=device)
    position_ids = torch.arange(output_ids.shape[1], device=device).unsqueeze(0)
    stop_ids = None if stop_token_ids is None else torch.tensor(stop_token_ids, device=device)

    past_key_values_target = DynamicCache()
    past_key_values_draft = DynamicCache()
    stage_times = empty_stage_times(DDTREE_STAGE_ORDER + DDTREE_TREE_BUILD_STAGE_ORDER)

    prefill_start = cuda_time()
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
    context = extract_context_feature(output.hidden_states, model.target_layer_ids)
    time_to_first_token = cuda_time() - prefill_start

    decode_start = cuda_time()
    clock_start = decode_start
    start = num_input_tokens
    acceptance_lengths: list[int] = []
    round_timestamps: list[float] = []
    round_trees: list[dict] | None = [] if save_tree_traces else None
    first_draft_round = True

    while start < max_length:
        block = output_ids[:, start : start + block_size].clone()

        tick = cuda_time()
        draft_hidden = model(
            target_hidden=context,
            noise_embedding=target.model.embed_tokens(block),
            position_ids=position_ids[:, past_key_values_draft.get_seq_length() : start + block_size],
            past_key_values=past_key_values_draft,
            use_cache=True,
            is_causal=False,
        )
        draft_logits = target.lm_head(draft_hidden[:, -horizon:, :])
        past_key_values_draft.crop(start)
        elapsed = cuda_time() - tick
        if first_draft_round:
            first_draft_round = False
            decode_start = cuda_time()
        else:
            stage_times["draft"] += elapsed

        tick = cuda_time()
        node_token_ids, node_depths, parents, child_maps, visibility, build_subtimes = build_ddtree_tree(
            draft_logits[0], tree_budget
        )
        stage_times["tree_build"] += cuda_time() - tick
        for name, seconds in build_subtimes.items():
            stage_times[name] += seconds

        tick = cuda_time()
        verify_input_ids, verify_position_ids, verify_attention_mask = compile_ddtree_tree(
            root_token_id=block[0, 0],
            start=start,
            node_token_ids=node_token_ids,
            node_depths=node_depths,
            visibility=visibility,
            past_length=start,
            dtype=target.dtype,
            device=device,
        )
        stage_times["tree_compile"] += cuda_time() - tick

        tick = cuda_time()
        output = target(
            verify_input_ids,
            position_ids=verify_position_ids,
            attention_mask=verify_attention_mask,
            past_key_values=past_key_values_target,
            use_cache=True,
            output_hidden_states=True,
        )
        stage_times["verify"] += cuda_time() - tick

        tick = cuda_time()
        posterior = sample(output.logits, temperature)
        accepted_indices, next_token = follow_verified_tree(child_maps, posterior)
        accepted = torch.tensor(accepted_indices, dtype=torch.long, device=device)
        output_ids[:, start : start + len(accepted_indices)] = verify_input_ids.index_select(1, accepted)
        output_ids[:, start + len(accepted_indices)] = next_token
        compact_dynamic_cache(past_key_values_target, start, accepted_indices)
        context = extract_context_feature(output.hidden_states, model.target_layer_ids).index_select(1, accepted)
        acceptance_lengths.append(len(accepted_indices))
        start += len(accepted_indices)
        stage_times["commit"] += cuda_time() - tick
        round_timestamps.append(cuda_time() - clock_start)
        if round_trees is not None:
            round_trees.append({
                "accepted_indices": list(accepted_indices),
                "tree": {
                    "node_token_ids": node_token_ids.tolist(),
                    "node_depths": node_depths.tolist(),
                    "parents": list(parents),
                },
            })

        committed = output_ids[0, start - len(accepted_indices) : start + 1]
        if stop_ids is not None and torch.isin(committed, stop_ids).any():
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
        round_trees=round_trees,
    )
