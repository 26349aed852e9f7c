"""Policy and critic compute: per-token log-probs, entropy and values, micro-batched.

Notation: `N` sequences, `P` prompt tokens, `T` response tokens, `V` vocabulary. Log-probs
are of the logits divided by the rollout temperature, as the sampler drew them (verl does the
same), so ``old_logprobs`` and ``rollout_logprobs`` measure the same distribution.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor, nn

from queryrl.algos import entropy_from_logits
from queryrl.engine.batch import Batch
from queryrl.models.loading import compute_autocast
from queryrl.models.vocab import head_tokens
from queryrl.padding import MIN_SHARED_PREFIX, mask_positions, shared_prefix


def logprobs_from_logits(logits: Tensor, tokens: Tensor) -> Tensor:
    """(n, t, V) logits, (n, t) tokens -> (n, t) log-probs, computed in float32."""
    logits = logits.float()
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def logprobs_and_entropy(logits: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(n, t) log-probs of `tokens` (with grad) and the (n, t) entropy as a metric (no grad), in float32,
    from one ``log_softmax`` of the (n, t, V) `logits`: the entropy ``-sum(p log p)`` reuses it instead
    of a second ``logsumexp`` and a ``softmax``, and the backward is ``log_softmax``'s single pass. Equal to
    :func:`logprobs_from_logits` and :func:`~queryrl.algos.entropy_from_logits` up to float rounding."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    detached = logp.detach()  # operations on it record no graph
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -(detached.exp() * detached).sum(-1)


def _unwrapped(model: nn.Module) -> nn.Module:
    """The Hugging Face model under peft, FSDP and ``torch.compile`` wrappers."""
    while True:
        inner: Any = None
        if hasattr(model, "get_base_model"):  # peft
            inner = getattr(model, "get_base_model")()  # noqa: B009 - nn.Module's __getattr__ types it a Tensor
        elif hasattr(model, "_orig_mod"):  # torch.compile
            inner = model._orig_mod
        elif type(model).__name__ == "FullyShardedDataParallel":
            inner = model.module
        if not isinstance(inner, nn.Module) or inner is model:
            return model
        model = inner


def keeps_logits(model: nn.Module) -> bool:
    """Whether `model`'s forward takes ``logits_to_keep`` (every transformers causal LM since 4.50).

    peft and FSDP pass unknown keyword arguments through to the wrapped model, so the wrapped
    model's signature decides. A model whose forward only swallows ``**kwargs`` is not trusted.
    """
    forward = _unwrapped(model).forward
    try:
        return "logits_to_keep" in inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False


def causal_lm_logits(model: nn.Module, keep: int, **inputs: Tensor) -> Tensor:
    """(n, keep, V) logits of the last `keep` positions of a causal-LM forward pass.

    The LM head runs on those positions only when the model takes ``logits_to_keep``: with a
    152k vocabulary, projecting the prompt positions costs about a quarter of an update's
    compute and memory for nothing. Other models project every position and are sliced after.
    """
    if keeps_logits(model):
        inputs_kw: dict[str, Tensor | int | bool] = {**inputs, "logits_to_keep": keep}
    else:
        inputs_kw = dict(inputs)
    with compute_autocast(model):  # mixed precision: bf16 compute over fp32 weights (model.compute_dtype)
        out = model(**inputs_kw, use_cache=False)
    logits: Tensor = out.logits[:, -keep:]
    return logits


def prompt_groups(batch: Batch) -> tuple[Tensor, Tensor] | None:
    """Rows that share a prompt: ``(rows, inverse)``, one row index per distinct prompt (u,) and, for
    each sequence, the position of its prompt in ``rows`` (N,); None when no two rows share one."""
    key = torch.cat([batch.prompt_ids, batch.prompt_mask.to(batch.prompt_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(key, dim=0, return_inverse=True)
    if distinct.shape[0] == key.shape[0]:
        return None
    rows = torch.empty(distinct.shape[0], dtype=torch.long, device=key.device)
    rows.scatter_(0, inverse, torch.arange(key.shape[0], device=key.device))
    return rows, inverse


def _cache_argument(model: nn.Module) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values``: the forward's key/value cache argument,
    also the output field that returns it."""
    forward = _unwrapped(model).forward
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def can_share_prompt(model: nn.Module) -> bool:
    """Whether :func:`shared_prompt_response_logits` can run on `model`: it needs ``logits_to_keep``
    and a key/value cache, which transformers turns off under gradient checkpointing."""
    inner = _unwrapped(model)
    name = (
        "is_activation_checkpointing"
        if hasattr(type(inner), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return keeps_logits(model) and not getattr(inner, name, False)


def _sharded(model: nn.Module) -> bool:
    """Whether `model` is an FSDP2 module (``fully_shard``), whose every forward is a collective."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed
        return False
    return isinstance(model, FSDPModule)


def _split_prefix(prompt_ids: Tensor, prompt_mask: Tensor, c: int) -> tuple[Tensor, Tensor]:
    """The left-padded prompts (u, P) without their first `c` real tokens: ``(rest_ids, rest_mask)``, (u, W),
    left-padded to the longest rest."""
    lengths = prompt_mask.sum(dim=1) - c
    width = int(lengths.max())
    p = prompt_ids.shape[1]
    columns = torch.arange(width, device=prompt_ids.device)
    rest_mask = (columns >= width - lengths.unsqueeze(1)).long()  # (u, W)
    source = (p - width + columns).expand_as(rest_mask)  # each row's rest ends in the last column, as its prompt
    return prompt_ids.gather(1, source) * rest_mask, rest_mask


def _prompt_pass(
    model: nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, room: int, share_prefix: bool = True
) -> tuple[Any, Tensor]:
    """The prompts' forward with a cache: ``(out, mask)``, `mask` the attention mask of the keys the cache holds.

    When the prompts share a prefix of at least :data:`MIN_SHARED_PREFIX` tokens (the system prompt) it runs
    once (:func:`prefix_cache`) and each prompt's rest on it; the rests are left-padded, so the padding sits
    between the prefix and a rest, which leaves attention unchanged unless a sliding window is shorter than the
    laid-out sequence (`room`: the response positions that follow): then the prompts run whole. Under FSDP
    they run whole too: each forward is an all-gather, and the ranks' micro-batches may decide differently.
    """
    c = shared_prefix(prompt_ids, prompt_mask) if share_prefix and not _sharded(model) else 0
    window = attention_window(model)
    if c >= MIN_SHARED_PREFIX and window != 0:
        rest_ids, rest_mask = _split_prefix(prompt_ids, prompt_mask, c)
        if window is None or c + rest_ids.shape[1] + room <= window:
            start = int(prompt_ids.shape[1] - prompt_mask[0].sum())
            cache = prefix_cache(model, prompt_ids[:1, start : start + c], prompt_ids.shape[0])
            mask = torch.cat([rest_mask.new_ones(rest_mask.shape[0], c), rest_mask], dim=1)
            with compute_autocast(model):
                out = model(
                    input_ids=rest_ids,
                    attention_mask=mask,
                    position_ids=c + mask_positions(rest_mask),
                    use_cache=True,
                    logits_to_keep=1,
                    **cache,
                )
            return out, mask
    with compute_autocast(model):
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=mask_positions(prompt_mask),
            use_cache=True,
            logits_to_keep=1,
        )
    return out, prompt_mask


def shared_prompt_response_logits(
    model: nn.Module, batch: Batch, rows: Tensor, inverse: Tensor, share_prefix: bool = True
) -> Tensor:
    """(n, t, V) response logits (not yet divided by the temperature), each distinct prompt run once.

    GRPO's n samples of a prompt share it: the prompt (~190 tokens in the query-rewrite demo)
    goes through the model once, its keys and values are indexed out to every sample, and only
    the responses (~13 tokens) run per sample. Gradients flow back through the shared keys and
    values, so the loss and its gradient are those of the full forward, up to float rounding.
    The idea is Prefix Grouper's (Liu et al. 2025, "Prefix Grouper: Efficient GRPO Training
    through Shared-Prefix Forward"); this is an implementation with transformers' cache. The
    distinct prompts' own common prefix (a system prompt) runs once too with `share_prefix`
    (``actor.share_prefix_forward``, :func:`_prompt_pass`).
    """
    prompt_ids, prompt_mask = batch.prompt_ids[rows], batch.prompt_mask[rows].long()
    t = batch.response_ids.shape[1]
    out, key_mask = _prompt_pass(model, prompt_ids, prompt_mask, t - 1, share_prefix)
    first = out.logits[:, -1:][inverse]  # scores response token 0
    if t == 1:
        return first
    cache_arg = _cache_argument(model)
    cache = out[cache_arg]
    cache.reorder_cache(inverse)  # (u, ...) -> (n, ...): an index_select, differentiable
    _, attention_mask, position_ids = batch.model_inputs()
    p = batch.prompt_ids.shape[1]
    with compute_autocast(model):
        rest = model(
            input_ids=batch.response_ids[:, :-1],
            attention_mask=torch.cat([key_mask[inverse], attention_mask[:, p : p + t - 1]], dim=1),
            position_ids=position_ids[:, p : p + t - 1],
            use_cache=True,
            logits_to_keep=0,
            **{cache_arg: cache},
        ).logits
    return torch.cat([first, rest], dim=1)


PACKED_ATTENTION = ("sdpa", "eager")  # attention implementations that take a custom (n, 1, L, L) mask
PACKED_LAYER_TYPES = ("full_attention", "sliding_attention")  # layer types whose mask the packed path builds


def can_pack_prompt(model: nn.Module) -> bool:
    """Whether :func:`packed_prompt_response_logits` can run on `model`: positions to keep given as indices
    (``logits_to_keep`` as a tensor), an attention implementation that takes a custom 4D mask, and layers
    that are full or sliding-window attention (the masks it builds)."""
    config = getattr(_unwrapped(model), "config", None)
    if config is None or not keeps_logits(model):
        return False
    if getattr(config, "_attn_implementation", None) not in PACKED_ATTENTION:
        return False
    return all(t in PACKED_LAYER_TYPES for t in getattr(config, "layer_types", None) or ())


def attention_window(model: nn.Module) -> int | None:
    """The sliding-window length of `model`'s attention (``config.sliding_window``) when a layer uses one, None
    when every layer attends to the whole sequence, 0 when a layer type is neither (full nor sliding)."""
    config = getattr(_unwrapped(model), "config", None)
    types = getattr(config, "layer_types", None)
    if types is not None and any(t not in PACKED_LAYER_TYPES for t in types):
        return 0
    if types is not None and all(t == "full_attention" for t in types):
        return None
    window = getattr(config, "sliding_window", None)
    return int(window) if window else None


def prefix_cache(model: nn.Module, prefix_ids: Tensor, n: int) -> dict[str, object]:
    """The key/value cache of `prefix_ids` (1, c), run once and indexed out to `n` rows (an index_select, so
    gradients from every row flow back into the one prefix pass), as the forward's cache keyword."""
    with compute_autocast(model):
        out = model(input_ids=prefix_ids, use_cache=True, logits_to_keep=1)
    name = _cache_argument(model)
    cache = out[name]
    cache.reorder_cache(torch.zeros(n, dtype=torch.long, device=prefix_ids.device))
    return {name: cache}


def _block_of_each_sample(inverse: Tensor) -> Tensor:
    """(n,) each sequence's place among the sequences of its prompt (0, 1, ... in batch order)."""
    order = torch.argsort(inverse, stable=True)
    counts = torch.bincount(inverse)
    starts = counts.cumsum(0) - counts
    block = torch.empty_like(inverse)
    block[order] = torch.arange(inverse.shape[0], device=inverse.device) - starts[inverse[order]]
    return block


def _packed_masks(model: nn.Module, valid: Tensor, index: Tensor, block_id: Tensor) -> Tensor | dict[str, Tensor]:
    """The attention masks of the packed layout: query ``i`` sees key ``j`` when ``j`` is a real token, not after
    ``i`` in the sequence both belong to (`index`: the position in that sequence with padding, (L,)), and in the
    prompt or ``i``'s own response (`block_id` -1 for the prompt, (L,)); every query sees itself, so no row is
    empty. Sliding-window layers also need ``index_i - index_j < window`` (transformers' rule). `valid`: (u, L)."""
    config: Any = _unwrapped(model).config
    causal = index[None, :] <= index[:, None]
    same = (block_id[:, None] == block_id[None, :]) | (block_id[None, :] == -1)
    eye = torch.eye(index.shape[0], dtype=torch.bool, device=index.device)
    full = ((causal & same)[None] & valid[:, None, :]) | eye  # (u, L, L)
    masks = {"full_attention": full}
    types = set(getattr(config, "layer_types", None) or ())
    if "sliding_attention" in types:
        window = int(config.sliding_window)
        masks["sliding_attention"] = full & ((index[:, None] - index[None, :] < window) | eye)
    if config._attn_implementation == "eager":  # additive float masks
        floor = torch.finfo(torch.float32).min
        masks = {k: torch.zeros(m.shape, device=m.device).masked_fill(~m, floor) for k, m in masks.items()}
    out = {k: m.unsqueeze(1) for k, m in masks.items()}  # (u, 1, L, L)
    return out if types else out["full_attention"]


def packed_prompt_response_logits(model: nn.Module, batch: Batch, rows: Tensor, inverse: Tensor) -> Tensor:
    """(n, t, V) response logits (not yet divided by the temperature), each distinct prompt run once, in one
    forward with no key/value cache: the way to share prompts under gradient checkpointing.

    Each distinct prompt becomes one sequence: the prompt, then the responses of its samples one after the
    other, with a 4D attention mask that lets each response see the prompt and itself only, and each token
    keep the position it has in its own sequence. The logits, and so the loss and its gradient, are those of
    the full forward up to float rounding. This is the shared-prefix attention of Prefix Grouper (Liu et al.
    2025, "Prefix Grouper: Efficient GRPO Training through Shared-Prefix Forward"); transformers' per-layer
    checkpointing recomputes it like any forward, where the cached path of
    :func:`shared_prompt_response_logits` cannot run. The masks are (u, L, L) with ``L = P + k t`` (`k` samples
    of the largest group): for many long responses per prompt they grow with the square of that length.
    """
    _, attention_mask, position_ids = batch.model_inputs()
    n, p = batch.prompt_ids.shape
    t = batch.response_ids.shape[1]
    u, device = rows.shape[0], rows.device
    block = _block_of_each_sample(inverse)
    k = int(block.max()) + 1
    responses = batch.response_ids.new_zeros(u, k, t)
    responses[inverse, block] = batch.response_ids
    response_valid = torch.zeros(u, k, t, dtype=torch.bool, device=device)
    response_valid[inverse, block] = attention_mask[:, p:].bool()
    response_positions = position_ids.new_zeros(u, k, t)
    response_positions[inverse, block] = position_ids[:, p:]
    input_ids = torch.cat([batch.prompt_ids[rows], responses.reshape(u, k * t)], dim=1)
    positions = torch.cat([position_ids[rows, :p], response_positions.reshape(u, k * t)], dim=1)
    valid = torch.cat([batch.prompt_mask[rows].bool(), response_valid.reshape(u, k * t)], dim=1)
    steps = torch.arange(t, device=device)
    index = torch.cat([torch.arange(p, device=device), (p + steps).repeat(k)])  # the position with padding
    block_id = torch.cat([torch.full((p,), -1, device=device), torch.arange(k, device=device).repeat_interleave(t)])
    # the logits kept: the prompt's last position (scores every response's token 0), then each block but its last
    kept = torch.cat(
        [
            torch.tensor([p - 1], device=device),
            (p + steps[:-1] + t * torch.arange(k, device=device)[:, None]).reshape(-1),
        ]
    )
    with compute_autocast(model):
        logits = model(
            input_ids=input_ids,
            attention_mask=_packed_masks(model, valid, index, block_id),
            position_ids=positions,
            use_cache=False,
            logits_to_keep=kept,
        ).logits  # (u, 1 + k (t - 1), V)
    where = torch.cat(
        [torch.zeros(n, 1, dtype=torch.long, device=device), 1 + block[:, None] * (t - 1) + steps[:-1]], 1
    )
    return logits[inverse[:, None], where]


def response_logits(
    model: nn.Module, batch: Batch, temperature: float, share_prompt: bool = False, share_prefix: bool = True
) -> Tensor:
    """(n, t, V) logits that scored each response token, divided by `temperature`.

    Position ``i`` predicts token ``i + 1``: the response's ``t`` tokens are scored by the last
    ``t + 1`` positions but the final one, so only those ``t + 1`` rows reach the LM head. With
    `share_prompt`, sequences with the same prompt run it once (:func:`shared_prompt_response_logits`).
    """
    groups = prompt_groups(batch) if share_prompt else None
    if groups is not None and can_share_prompt(model):
        logits = shared_prompt_response_logits(model, batch, *groups, share_prefix=share_prefix)
    elif groups is not None and can_pack_prompt(model):  # under gradient checkpointing: no cache
        logits = packed_prompt_response_logits(model, batch, *groups)
    else:
        input_ids, attention_mask, position_ids = batch.model_inputs()
        t = batch.response_ids.shape[1]
        logits = causal_lm_logits(
            model, t + 1, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
        )[:, :-1]
    return logits if temperature == 1.0 else logits / temperature  # x / 1.0 is x: no pass over (n, t, V)


def forward_logprobs(
    model: nn.Module,
    batch: Batch,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool = True,
    share_prompt: bool = False,
    share_prefix: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (n, t) of the response tokens (with grad), and their entropy (n, t) if asked.

    With ``entropy_grad=False`` the entropy is a metric with no graph, taken with the log-probs from one
    ``log_softmax`` (:func:`logprobs_and_entropy`).

    With a restricted output head (``model.vocab.restrict``, :mod:`queryrl.models.vocab`) the logits are over
    the kept tokens, and so are the log-probs and the entropy: the response ids are looked up as restricted
    indices (a trained-on token outside the kept set is an error).
    """
    logits = response_logits(model, batch, temperature, share_prompt, share_prefix)
    tokens = head_tokens(model, batch.response_ids, batch.response_mask)
    if with_entropy and not entropy_grad:  # the update's metric: one log_softmax for both
        return logprobs_and_entropy(logits, tokens)
    logprobs = logprobs_from_logits(logits, tokens)
    entropy = entropy_from_logits(logits.float()) if with_entropy else None
    return logprobs, entropy


@torch.no_grad()
def compute_logprobs(
    model: nn.Module,
    batch: Batch,
    micro_batch_size: int,
    temperature: float,
    with_entropy: bool = False,
    share_prompt: bool = False,
    share_prefix: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (N, T) (and entropy) over the whole batch, `micro_batch_size` sequences at a time."""
    was_training = model.training
    model.eval()
    width = batch.response_ids.shape[1]
    logprobs, entropies = [], []
    try:
        for micro in batch.split(micro_batch_size):
            micro = micro.trimmed()
            lp, ent = forward_logprobs(
                model, micro, temperature, with_entropy, share_prompt=share_prompt, share_prefix=share_prefix
            )
            logprobs.append(micro.pad_responses_to(width, lp))
            if ent is not None:
                entropies.append(micro.pad_responses_to(width, ent))
    finally:
        model.train(was_training)
    return torch.cat(logprobs), (torch.cat(entropies) if with_entropy else None)


def forward_values(critic: nn.Module, batch: Batch) -> Tensor:
    """(n, t) values of the states before each response token; with grad."""
    input_ids, attention_mask, position_ids = batch.model_inputs()
    p = batch.prompt_ids.shape[1]
    with compute_autocast(critic):
        values: Tensor = critic(input_ids, attention_mask, position_ids)[:, p - 1 : -1]
    return values.float()


@torch.no_grad()
def compute_values(critic: nn.Module, batch: Batch, micro_batch_size: int) -> Tensor:
    """Values (N, T) over the whole batch, `micro_batch_size` sequences at a time."""
    was_training = critic.training
    critic.eval()
    width = batch.response_ids.shape[1]
    try:
        chunks = [
            micro.pad_responses_to(width, forward_values(critic, micro))
            for micro in (m.trimmed() for m in batch.split(micro_batch_size))
        ]
    finally:
        critic.train(was_training)
    return torch.cat(chunks)
