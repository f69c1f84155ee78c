"""Exact speculative verification on hybrid targets (Gated DeltaNet + full attention, e.g. Qwen3.5/3.6).

Added to a DDTree checkout as ddops_hybrid_verify.py by ddops' hybrid-tree-verify playbook, which also makes
ddtree.py, dflash.py and model/dflash.py call it. Full-attention layers obey DDTree's tree mask; Gated DeltaNet
layers do not: their recurrent and conv states run through the flattened tree in order, and a crop does not take
rejected tokens back out of the recurrent state. Here the verify stays one forward: each Gated DeltaNet layer
computes the chunked (WY/UT) form of the gated delta rule over the tree as one chunk, with the log decay summed
along each node's path and the ancestor mask for the causal mask, and its short conv reads each node's ancestors.
The cache keeps the pre-verify recurrent state; the commit folds it along the accepted path (no second forward).
DFlash's block is the chain case. Where the layers cannot be routed (verify_route says why) the reference method
runs instead, and every verify is counted by the path it took (verify_paths) so that a benchmark can say which.
On releases whose hybrid brings its own cache class (5.2-5.4), target_cache gives the prefill one of those, read
like transformers' cache.
"""

from __future__ import annotations

import contextlib
import copy
import dis
import functools
import inspect
import sys
from types import SimpleNamespace

import torch

ONE_FORWARD = "one-forward"
# What the routed functions must take first: the torch reference implementations' parameters, whose arithmetic the
# tree forms reproduce.
CONV_PARAMS = ("weight", "bias", "activation")
RULE_PARAMS = ("query", "key", "value", "g", "beta")


# --- the public calls the patched files make ---------------------------------------------------------------------

def verify_tree(target, input_ids, position_ids, attention_mask, cache, parents):
    """The target's output for every tree node, each computed from its own ancestors only (DDTree's verify)."""
    forward = functools.partial(target, input_ids, position_ids=position_ids, attention_mask=attention_mask,
                                past_key_values=cache, use_cache=True, output_hidden_states=True)
    if not linear_layers(cache):
        return forward()
    if len(parents) == 1:  # the root alone: plain decoding, exact as it is
        return forward()
    route = verify_route(target, cache, input_ids.shape[0])
    _count(cache, route)
    if isinstance(route, str):
        cache._ddops_tree = "paths"
        return _verify_tree_by_paths(target, input_ids, position_ids, cache, parents)
    with _routed(route, cache, parents) as state:
        output = forward()
    cache._ddops_tree = state
    return output


def commit_tree(target, cache, past_length, accepted, input_ids, compact):
    """Keep the accepted nodes (a root-to-node path) in the target cache; compact is DDTree's own compaction."""
    if not linear_layers(cache):
        compact(cache, past_length, accepted)
        return
    state = vars(cache).pop("_ddops_tree", None)  # absent after a tree of the root alone: nothing to undo
    if isinstance(state, SimpleNamespace):
        _commit_routed(cache, state, past_length, accepted)
        return
    if state == "paths":  # the reference verified on a copy: the accepted chain on the untouched cache
        index = torch.tensor(accepted, dtype=torch.long, device=input_ids.device)
        positions = past_length + torch.arange(len(accepted), device=input_ids.device).unsqueeze(0)
        _forward(target, input_ids.index_select(1, index), position_ids=positions, past_key_values=cache,
                 use_cache=True, logits_to_keep=1)
    _trim_recording(cache)


def verify_chain(target, cache):
    """target, made to verify a DFlash block exactly: the caller's next crop of cache commits the accepted prefix."""

    def verify(input_ids, *args, **kwargs):
        unclaimed = vars(cache).pop("crop", None)
        if unclaimed is not None:  # no crop since the last block (crop-relative skips one that removes nothing)
            unclaimed(0)
        if not linear_layers(cache) or input_ids.shape[1] == 1:
            return target(input_ids, *args, **kwargs)
        past_length, size = int(cache.get_seq_length()), input_ids.shape[1]
        route = verify_route(target, cache, input_ids.shape[0])
        _count(cache, route)
        if isinstance(route, str):
            output, commit = _verify_chain_by_rerun(target, cache, input_ids, past_length, kwargs)
        else:
            with _routed(route, cache, list(range(-1, size - 1))) as state:
                output = target(input_ids, *args, **kwargs)

            def commit(length):
                _commit_routed(cache, state, past_length, list(range(length - past_length)))

        def crop(length):
            vars(cache).pop("crop", None)
            kept = int(length) if length > 0 else past_length + size + int(length)
            if not 1 <= kept - past_length <= size:
                raise ValueError(f"crop({length}) after verifying {size} tokens on {past_length}: keeps none of them")
            commit(kept)

        cache.crop = crop
        return output

    return verify


def target_cache(target, cache):
    """The cache the target's prefill is to fill: cache itself, unless the target's linear layers read a cache class
    of their modeling module's own that cache is not (5.2-5.4's Qwen3_5DynamicCache: transformers' DynamicCache has
    no has_previous_state there). Then an empty one of that class, which also reads like transformers' cache."""
    own = _own_cache_class(target)
    if own is None or isinstance(cache, own) or hasattr(cache, "has_previous_state"):
        return cache
    config = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    return _adapted(own)(config)


def verify_paths(cache):
    """{path: verify rounds} for the run on cache ("one-forward", or "reference: <why>"); None when none ran."""
    return dict(vars(cache).get("_ddops_verify_paths", {})) or None


def _count(cache, route):
    label = f"reference: {route}" if isinstance(route, str) else ONE_FORWARD
    counts = vars(cache).setdefault("_ddops_verify_paths", {})
    counts[label] = counts.get(label, 0) + 1


# --- the cache, across transformers releases ----------------------------------------------------------------------
# A linear layer holds its states as tensors (5.2-5.13; on 5.2-5.4 through the adapter below) or as {state index:
# tensor} (5.14+); has_previous_state is a bool, then a dict; 5.25 also counts its tokens (cumulative_length_linear)
# and keeps recurrent states for crops.

def linear_layers(cache):
    """The cache's linear-attention (recurrent) layers by index: the layers a tree attention mask cannot reach."""
    return {index: layer for index, layer in enumerate(getattr(cache, "layers", ()))
            if hasattr(layer, "recurrent_states")}


def _state(layer, name):
    value = getattr(layer, name)
    return value.get(0) if isinstance(value, dict) else value


def _set_state(layer, name, tensor):
    """Copy in place where the shape allows (the cache may hold static addresses), else assign."""
    value = getattr(layer, name)
    current = value.get(0) if isinstance(value, dict) else value
    if current is not None and current.shape == tensor.shape and not getattr(layer, "record_past", False):
        current.copy_(tensor)
    elif isinstance(value, dict):
        value[0] = tensor.contiguous()
    else:
        setattr(layer, name, tensor.contiguous())


def _holds_state(layer):
    started = layer.has_previous_state
    started = started.get(0) if isinstance(started, dict) else started
    return bool(started) and _state(layer, "recurrent_states") is not None and _state(layer, "conv_states") is not None


def _set_length(layer, length):
    if isinstance(getattr(layer, "cumulative_length_linear", None), torch.Tensor):
        layer.cumulative_length_linear.fill_(length)
    history = getattr(layer, "recurrent_states_history", None)
    if isinstance(history, dict):  # what 5.25 recorded for its own crop: nothing left to take back
        layer.recurrent_states_history = {index: [] for index in history}


def _trim_recording(cache):
    """Drop the conv windows a recording cache keeps for crops (crop(0) on 5.14+): nothing here is rolled back."""
    if any(getattr(layer, "record_past", False) for layer in cache.layers):
        cache.crop(0)


# --- a modeling module's own cache (5.2-5.4): the same reads ---------------------------------------------------
# Qwen3_5DynamicCache keeps lists (key_cache, value_cache, conv_states, recurrent_states, one entry per layer), has no
# crop, and its linear layers read cached state in a one-token forward only: a multi-token forward over it restarts
# them from zero state. The adapter gives it transformers' layer view and crop; the references step token by token.

def _is_linear_module(module):
    """Whether a module of the target is one of its Gated DeltaNet layers (a short conv and a layer index)."""
    return hasattr(module, "conv1d") and getattr(module, "layer_idx", None) is not None


def _first_linear_module(target):
    return next((module for module in target.modules() if _is_linear_module(module)), None)


def _own_cache_class(target):
    """The cache class the modeling module of the target's linear-attention layers defines, if any."""
    module = _first_linear_module(target)
    home = sys.modules.get(type(module).__module__) if module is not None else None
    if home is None:
        return None
    found = [value for name, value in vars(home).items() if name.endswith("DynamicCache")
             and isinstance(value, type) and value.__module__ == home.__name__
             and hasattr(value, "has_previous_state") and hasattr(value, "update")]
    return found[0] if found else None


@functools.cache
def _adapted(own):
    """own, with transformers' cache.layers view and crop."""
    return type(own.__name__, (own,), {
        "__doc__": f"{own.__name__}, read like transformers' DynamicCache (ddops_hybrid_verify).",
        "layers": property(lambda self: [_LinearLayer(self, index) if kind == "linear_attention"
                                         else _AttentionLayer(self, index)
                                         for index, kind in enumerate(self.layer_types)]),
        "crop": _crop_own,
        # A multi-token forward restarts the linear layers from zero state: the references step token by token.
        "_ddops_stepwise": True,
    })


def _crop_own(cache, max_length):
    """transformers' DynamicCache.crop on the attention layers (a negative count removes that many tokens). The
    linear layers' states cannot be taken back: the verify restores them itself."""
    length = int(cache.get_seq_length())
    kept = length - abs(max_length) if max_length < 0 else max_length
    if kept >= length:
        return
    for index, keys in enumerate(cache.key_cache):
        if keys is not None:
            cache.key_cache[index] = keys[..., :kept, :]
            cache.value_cache[index] = cache.value_cache[index][..., :kept, :]


class _ListView:
    """One layer of a list-keeping cache, its attributes read from and written to the cache's lists."""

    _names: dict = {}

    def __init__(self, cache, index):
        object.__setattr__(self, "_cache", cache)
        object.__setattr__(self, "_index", index)

    def __getattr__(self, name):
        if name not in self._names:
            raise AttributeError(name)
        return getattr(self._cache, self._names[name])[self._index]

    def __setattr__(self, name, value):
        if name not in self._names:
            raise AttributeError(f"{type(self).__name__} has no {name}")
        getattr(self._cache, self._names[name])[self._index] = value


class _AttentionLayer(_ListView):
    _names = {"keys": "key_cache", "values": "value_cache"}


class _LinearLayer(_ListView):
    _names = {"conv_states": "conv_states", "recurrent_states": "recurrent_states"}

    @property
    def has_previous_state(self):
        return self.recurrent_states is not None and self.conv_states is not None


# --- the route: may the tree go through this target's Gated DeltaNet layers in one forward? ---------------------

def verify_route(target, cache, batch_size):
    """The swaps that route the target's linear layers through the tree, or why that cannot be done (a string)."""
    if batch_size != 1:
        return f"batch of {batch_size}, not 1"
    linear = linear_layers(cache)
    modules = {module.layer_idx: module for module in target.modules()
               if _is_linear_module(module) and module.layer_idx in linear}
    if set(modules) != set(linear):
        return "the target's linear-attention modules do not match the cache's linear layers"
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        return "the cache has sliding-window layers"
    homes, swaps = set(), []
    for index, module in sorted(modules.items()):
        if getattr(linear[index], "number_of_states", 1) != 1 or not _holds_state(linear[index]):
            return f"linear layer {index} holds no single conv and recurrent state yet"
        if "forward" in vars(module):
            return f"layer {index}: its forward was replaced on the instance"
        forward = _plain(type(module).forward)
        home = sys.modules.get(type(module).__module__)
        if home is None or getattr(forward, "__globals__", None) is not vars(home):
            return f"{type(module).__name__}.forward is not its modeling module's own (a kernel replaced it)"
        homes.add(home)
        if len(homes) > 1:
            return "linear-attention layers from more than one modeling module"
        found = _swaps(module, forward, home)
        if isinstance(found, str):
            return found
        swaps += found
        if getattr(module, "activation", None) not in (None, "silu", "swish"):
            return f"layer {index}: activation {module.activation!r}"
    # A module-level function is swapped once, however many layers call it.
    unique = {(id(owner), name): (owner, name, kind) for owner, name, kind in swaps}
    conv_weights = {module.conv1d.weight.data_ptr(): index for index, module in modules.items()}
    return SimpleNamespace(swaps=list(unique.values()), conv_weights=conv_weights, modules=modules)


def _names(function):
    """(global names, attribute names) a function's code loads."""
    instructions = list(dis.get_instructions(function))
    loaded = {i.argval for i in instructions if i.opname == "LOAD_GLOBAL"}
    attributes = {i.argval for i in instructions if i.opname in ("LOAD_ATTR", "LOAD_METHOD")}
    return loaded, attributes


# The closure cells through which transformers' own wrappers reach what they wrap: kernels' function modules
# (5.25+ wraps module-level functions in one) and accelerate's force_accelerate_hooks (5.14-5.15, no __wrapped__).
_WRAPPED_CELLS = ("func", "forward_func")


def _plain(function):
    """The function behind transformers' wrappers of it (functools.wraps, or one of _WRAPPED_CELLS)."""
    if isinstance(function, torch.nn.Module):
        function = type(function).forward
    for _ in range(8):
        function = inspect.unwrap(function)
        code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None) or ()
        inner = [cell.cell_contents for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False)
                 if name in _WRAPPED_CELLS and callable(cell.cell_contents)]
        if not inner:
            return function
        function = inner[0]
    return function


def _takes(function, params, skip=0):
    try:
        return tuple(inspect.signature(_plain(function)).parameters)[skip:skip + len(params)] == params
    except (TypeError, ValueError):
        return False


def _swaps(module, forward, home):
    """Where this layer's forward finds its conv and its chunked rule: [(owner, name, "conv" | "rule")], or why not.

    5.14-5.24 call module-level causal_conv1d_fn and torch_chunk_gated_delta_rule; 5.25 calls causal_conv1d_forward,
    which calls causal_conv1d_fn; 5.2-5.13 call the instance's causal_conv1d_fn (None without the kernel package:
    then the layer's own nn.Conv1d runs) and chunk_gated_delta_rule."""
    loaded, attributes = _names(forward)
    name = type(module).__name__
    if "torch_chunk_gated_delta_rule" in loaded:
        rule = (home, "torch_chunk_gated_delta_rule")
    elif "chunk_gated_delta_rule" in attributes and "chunk_gated_delta_rule" in vars(module):
        rule = (module, "chunk_gated_delta_rule")
    else:
        return f"{name}.forward does not call torch_chunk_gated_delta_rule"
    reaches_conv = "causal_conv1d_fn" in loaded
    if not reaches_conv and "causal_conv1d_forward" in loaded and hasattr(home, "causal_conv1d_forward"):
        outer = _plain(home.causal_conv1d_forward)
        reaches_conv = getattr(outer, "__globals__", None) is vars(home) and "causal_conv1d_fn" in _names(outer)[0]
    if reaches_conv:
        conv = (home, "causal_conv1d_fn")
    elif "causal_conv1d_fn" in attributes and "causal_conv1d_fn" in vars(module):
        conv = (module, "causal_conv1d_fn")
    else:
        return f"{name}.forward does not call causal_conv1d_fn"
    if not _takes(getattr(*rule, None), RULE_PARAMS):
        return f"{_owner_name(rule[0])}.{rule[1]} does not take {RULE_PARAMS}"
    conv_function = getattr(*conv, None)
    if not (conv_function is None and conv[0] is module) and not _takes(conv_function, CONV_PARAMS, skip=1):
        return f"{_owner_name(conv[0])}.{conv[1]} does not take (x, {', '.join(CONV_PARAMS)})"
    return [(*conv, "conv"), (*rule, "rule")]


def _owner_name(owner):
    return getattr(owner, "__name__", type(owner).__name__)


# --- the tree forms -------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _routed(route, cache, parents):
    """Within it the target's linear layers verify the tree given by parents (each parent precedes its children) in
    one forward; yields the state the commit folds."""
    paths = []
    for node, parent in enumerate(parents):
        paths.append((paths[parent] if parent >= 0 else []) + [node])
    size = len(parents)
    device = next(iter(route.modules.values())).conv1d.weight.device
    ancestors = torch.zeros(size, size)
    ancestors[[path[-1] for path in paths for _ in path], [node for path in paths for node in path]] = 1.0
    ancestors = ancestors.to(device)
    linear = linear_layers(cache)
    state = SimpleNamespace(
        paths=paths, ancestors=ancestors, unrelated=ancestors == 0, conv_weights=route.conv_weights, conv_taps={},
        layers={}, current=None,
        # The windows and states before the verify: some releases overwrite the cached window before the conv runs,
        # or pass no initial state to a multi-token forward.
        windows={index: _state(layer, "conv_states")[..., -route.modules[index].conv1d.weight.shape[-1]:].clone()
                 for index, layer in linear.items()},
        initial={index: _state(layer, "recurrent_states") for index, layer in linear.items()})
    forms = {"conv": functools.partial(_tree_conv, state), "rule": functools.partial(_tree_rule, state)}
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in route.swaps]
    keep = {index: layer.recurrent_states_to_keep for index, layer in linear.items()
            if hasattr(layer, "recurrent_states_to_keep")}
    try:
        for owner, name, kind in route.swaps:
            setattr(owner, name, forms[kind])
        for index in keep:  # 5.25: no per-token states; the whole tree goes through the chunked rule
            linear[index].recurrent_states_to_keep = 0
        yield state
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)
        for index, count in keep.items():
            linear[index].recurrent_states_to_keep = count


def _tree_conv(state, hidden_states=None, weight=None, bias=None, activation=None, *, x=None, **kwargs):
    """The short causal conv over a tree: each node reads its own ancestors' inputs, and above the root the cached
    window. The tree's inputs are the last columns of what the layer passes (some releases prepend the window)."""
    inputs = hidden_states if hidden_states is not None else x
    index = state.conv_weights[weight.data_ptr()]
    state.current = index
    size, kernel = len(state.paths), weight.shape[-1]
    window = state.windows[index][..., -kernel:]
    inputs = torch.cat([window.to(inputs.dtype), inputs[..., -size:]], dim=-1)
    taps = state.conv_taps.get((kernel, window.shape[-1]))
    if taps is None:
        rows = []
        for path in state.paths:
            row = []
            for back in range(kernel - 1, -1, -1):  # the ancestor `back` steps up, or the window above the root
                row.append(window.shape[-1] + path[-1 - back] if back < len(path)
                           else window.shape[-1] + len(path) - 1 - back)
            rows.append(row)
        taps = state.conv_taps[(kernel, window.shape[-1])] = torch.tensor(rows, device=inputs.device)
    out = torch.einsum("bcnk,ck->bcn", inputs.to(weight.dtype)[:, :, taps], weight)
    if bias is not None:
        out = out + bias[:, None]
    if activation is not None:
        out = torch.nn.functional.silu(out)
    state.layers[index] = {"conv_inputs": inputs, "window": window.shape[-1]}
    # Some releases keep only the last columns of what the conv returns: the window's part is never read.
    return torch.cat([out.new_zeros(*out.shape[:2], max(0, _width(hidden_states, x) - size)), out], dim=-1).to(
        inputs.dtype)


def _width(hidden_states, x):
    return (hidden_states if hidden_states is not None else x).shape[-1]


def _tree_rule(state, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs):
    """The chunked (WY/UT) gated delta rule over a tree, as one chunk: decay summed along each node's path, and the
    causal mask replaced by the ancestor mask. Parents precede children, so the system stays unit lower triangular
    and one solve gives every node from its own ancestors. The recurrent state comes back unchanged: the commit
    folds it along the accepted path from what is kept here."""
    record = state.layers[state.current]
    initial = state.initial[state.current]
    dtype = query.dtype
    if key.shape[2] != value.shape[2]:
        groups = value.shape[2] // key.shape[2]
        query, key = query.repeat_interleave(groups, dim=2), key.repeat_interleave(groups, dim=2)
    query, key, value, beta, g = (t.transpose(1, 2).float() for t in (query, key, value, beta, g))
    if use_qk_l2norm_in_kernel:
        query = query * torch.rsqrt((query * query).sum(-1, keepdim=True) + 1e-6)
        key = key * torch.rsqrt((key * key).sum(-1, keepdim=True) + 1e-6)
    query = query * query.shape[-1] ** -0.5
    path_decay = g @ state.ancestors.transpose(0, 1)  # [b, h, n]: log decay summed along each node's path
    pairwise = path_decay.unsqueeze(-1) - path_decay.unsqueeze(-2)
    pairwise = pairwise.masked_fill(state.unrelated, float("-inf")).exp()
    k_beta = key * beta.unsqueeze(-1)
    system = (k_beta @ key.transpose(-1, -2)) * pairwise
    solved = torch.linalg.solve_triangular(
        system, torch.cat([value * beta.unsqueeze(-1), k_beta * path_decay.exp().unsqueeze(-1)], dim=-1),
        upper=False, unitriangular=True)
    new_values, k_decayed = solved.split([value.shape[-1], key.shape[-1]], dim=-1)
    start = initial.float()
    new_values = new_values - k_decayed @ start
    out = (query * path_decay.exp().unsqueeze(-1)) @ start
    out = out + ((query @ key.transpose(-1, -2)) * pairwise) @ new_values
    record.update(keys=key, new_values=new_values, path_decay=path_decay)
    return out.transpose(1, 2).to(dtype), (initial if output_final_state else None)


def _commit_routed(cache, state, past_length, accepted):
    """Keep the accepted nodes of a tree verified in one forward: attention keys and values compacted, each linear
    layer's recurrent state folded along the path from the verify's own quantities, its conv window set to the
    last node's."""
    last, length = accepted[-1], past_length + len(accepted)
    keep = path = None
    for index, layer in enumerate(cache.layers):
        record = state.layers.get(index)
        if record is not None:
            if path is None or path.device != record["keys"].device:  # one host-to-device copy, not one per layer
                path = torch.tensor(state.paths[last], device=record["keys"].device)
            decay = record["path_decay"]
            weights = (decay[..., last:last + 1] - decay.index_select(-1, path)).exp()
            folded = state.initial[index].float() * decay[..., last, None, None].exp() + (
                record["keys"].index_select(-2, path) * weights.unsqueeze(-1)).transpose(-1, -2) @ \
                record["new_values"].index_select(-2, path)
            _set_state(layer, "recurrent_states", folded.to(state.initial[index].dtype))
            inputs, window = record["conv_inputs"], record["window"]
            conv = torch.cat([inputs[..., :window], inputs.index_select(-1, path + window)], dim=-1)[..., -window:]
            _set_state(layer, "conv_states", conv.to(state.windows[index].dtype))
            _set_length(layer, length)
        keys = getattr(layer, "keys", None)
        if keys is None or keys.numel() == 0:
            continue
        if accepted != list(range(len(accepted))):
            if keep is None or keep.device != keys.device:
                keep = torch.tensor(accepted, dtype=torch.long, device=keys.device) + past_length
            for name in ("keys", "values"):
                tensor = getattr(layer, name)
                tensor.narrow(-2, past_length, len(accepted)).copy_(tensor.index_select(-2, keep))
        layer.keys, layer.values = layer.keys[..., :length, :], layer.values[..., :length, :]


# --- the reference: what the one-forward route must equal, and what runs where it cannot be taken ----------------

def _verify_tree_by_paths(target, input_ids, position_ids, cache, parents):
    """Each root-to-leaf path is one row of a batch over a copy of the cache (causal within the row, right-padded,
    so causal and recurrent layers never see the padding), each node read from a row that holds it at its own
    depth. The cache is left as it was."""
    size = len(parents)
    is_parent = [False] * size
    for node in range(1, size):
        is_parent[parents[node]] = True
    paths, row_of, depth_of = [], [0] * size, [0] * size
    for leaf in (node for node in range(size) if not is_parent[node]):
        path = [leaf]
        while path[-1] != 0:
            path.append(parents[path[-1]])
        path.reverse()
        for depth, node in enumerate(path):
            row_of[node], depth_of[node] = len(paths), depth
        paths.append(path)
    width = max(len(path) for path in paths)
    device = input_ids.device
    rows = torch.tensor([path + [path[-1]] * (width - len(path)) for path in paths], device=device)
    batch_ids = input_ids[0].index_select(0, rows.reshape(-1)).reshape(rows.shape)
    batch_positions = (position_ids[0, :1] + torch.arange(width, device=device)).expand(len(paths), width)
    batch_cache = copy.deepcopy(cache)
    batch_cache.reorder_cache(torch.zeros(len(paths), dtype=torch.long, device=device))
    output = _forward(target, batch_ids, position_ids=batch_positions, past_key_values=batch_cache, use_cache=True,
                      output_hidden_states=True)
    row_index = torch.tensor(row_of, dtype=torch.long, device=device)
    depth_index = torch.tensor(depth_of, dtype=torch.long, device=device)
    return SimpleNamespace(
        logits=output.logits[row_index, depth_index].unsqueeze(0),
        hidden_states=tuple(states[row_index, depth_index].unsqueeze(0) for states in output.hidden_states))


def _verify_chain_by_rerun(target, cache, input_ids, past_length, kwargs):
    """DFlash's block as the target runs it, its linear states saved before; the commit puts them back, crops the
    attention layers and runs the accepted prefix again."""
    saved = {index: copy.deepcopy(layer) if not _holds_state(layer)
             else (_state(layer, "recurrent_states").clone(), _state(layer, "conv_states").clone())
             for index, layer in linear_layers(cache).items()}
    output = _forward(target, input_ids, **kwargs)
    positions = kwargs.get("position_ids")

    def commit(length):
        for index, kept in saved.items():
            if not isinstance(kept, tuple):  # a layer without both states yet (one the target never fills)
                cache.layers[index] = kept
                continue
            layer = cache.layers[index]
            _set_state(layer, "recurrent_states", kept[0])
            _set_state(layer, "conv_states", kept[1])
            _set_length(layer, past_length)
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys, layer.values = layer.keys[..., :past_length, :], layer.values[..., :past_length, :]
        kept = length - past_length
        _forward(target, input_ids[:, :kept], position_ids=None if positions is None else positions[:, :kept],
                 past_key_values=cache, use_cache=True, logits_to_keep=1)
        _trim_recording(cache)

    return output, commit


def _forward(target, input_ids, **kwargs):
    """target(input_ids, **kwargs) over the cache in kwargs; one token at a time where a multi-token forward would
    restart the linear layers from zero state: a one-token forward reads the cached states."""
    if input_ids.shape[1] == 1 or not _restarts_multi_token(target, kwargs.get("past_key_values")):
        return target(input_ids, **kwargs)
    positions = kwargs.pop("position_ids", None)
    steps = [target(input_ids[:, step:step + 1], **kwargs,
                    position_ids=None if positions is None else positions[..., step:step + 1])
             for step in range(input_ids.shape[1])]
    hidden = steps[0].hidden_states
    return SimpleNamespace(
        logits=torch.cat([out.logits for out in steps], dim=1),
        hidden_states=None if hidden is None else tuple(
            torch.cat(layer, dim=1) for layer in zip(*(out.hidden_states for out in steps), strict=True)))


def _restarts_multi_token(target, cache):
    """Whether a multi-token forward over cache starts the target's linear layers from zero state: on a modeling
    module's own cache (5.2-5.4), and wherever the layer hands its chunked rule initial_state=None (5.2-5.6)."""
    if getattr(cache, "_ddops_stepwise", False):
        return True
    module = _first_linear_module(target)
    return module is not None and _forward_ignores_cached_state(type(module))


@functools.cache
def _forward_ignores_cached_state(layer_class):
    """Whether the layer class's forward hands its chunked rule initial_state=None: read once per class, not per
    verify."""
    try:
        return "initial_state=None" in inspect.getsource(_plain(layer_class.forward))
    except (OSError, TypeError):  # no source to read: as 5.7+ do, the forward reads the cached state
        return False
