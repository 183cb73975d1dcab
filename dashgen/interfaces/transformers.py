"""dashgen as a Hugging Face transformers attention implementation (transformers 5).

register() adds "dashgen" to transformers' AttentionInterface (dashgen_attention) and
AttentionMaskInterface (dashgen_mask); after it, from_pretrained(..., attn_implementation=
"dashgen") runs every attention layer on dashgen.attention, whose backward follows
torch.use_deterministic_algorithms. Nothing is registered until register() is called.

dashgen serves plain causal or full attention over whole sequences, GQA included (key and value
keep their own heads), a layer's sliding window (Mistral, Gemma, GPT-OSS), soft-capping (Gemma
2) and sinks (GPT-OSS's s_aux), and Llama 4's chunked layers (config.layer_types and
attention_chunk_size). Two paths run on dashgen.attention_varlen, each sequence's bits its own:
the padding-free one, documents packed into one row as transformers' DataCollatorWithFlattening
hands them over (the cu_seq_lens_q/k and max_length_q/k kwargs, position_ids that restart at
each document, or seq_idx, which hybrid models' collators send beside them and which must
agree), and padded batches (left or right padding, the 2-D mask dashgen_mask passes on):
each row's kept tokens run as one sequence, as under "flash_attention_2", and padded query
positions come back as zeros (interfaces/padding.py). What it cannot serve raises ValueError
naming the argument, never a silent change: masks other than padding, position biases,
dropout. The mask function is what makes padding visible: transformers builds no mask at all
for an implementation without one, and the padding would go unseen. torch.compile works (the
custom ops trace); pass the cu_seq_lens kwargs there, since offsets found from position_ids,
like a padded batch's lengths, are read on the host.
"""
from __future__ import annotations

import weakref

import torch

from ..runtime import op
from .flash_attn import run_padded
from .padding import Unpadded, padded_batch

# transformers is optional: this module imports without it (pytest's --doctest-modules imports
# every module of the package), and register() says how to install it.
try:
    import transformers
    from transformers import masking_utils
except ImportError:
    transformers = masking_utils = None

IMPL_NAME = "dashgen"

_PREFIX = f'attn_implementation="{IMPL_NAME}": '


def _refuse(message: str) -> ValueError:
    return ValueError(_PREFIX + message)


def _require_transformers() -> None:
    if transformers is None:
        raise ImportError("dashgen.interfaces.transformers needs Hugging Face transformers 5 or "
                          "newer: pip install 'transformers>=5' (or pip install 'dashgen[hf]')")
    major = int(transformers.__version__.split(".")[0])
    if major < 5:
        raise ImportError(f"dashgen.interfaces.transformers needs transformers 5 or newer, found "
                          f"{transformers.__version__}: pip install 'transformers>=5'")


# -- packed sequences in position_ids ------------------------------------------------------------
# Every layer of a forward gets the same position_ids tensor; checking it costs a device sync, so
# the last tensor found consecutive (and its version, for in-place changes) is remembered.
_CONSECUTIVE: tuple[weakref.ref, int] | None = None

# Whether the last mask dashgen_mask made, for the config it was made for, marked documents
# packed by position_ids (transformers saw them restart; not while torch.compile traces, where
# it marks every row so). A model whose layers keep position_ids from the attention (Llama 4's)
# would otherwise run the row as one sequence.
_PACKED_MASK: tuple[weakref.ref, bool] | None = None


def _note_packed_mask(config, packed: bool) -> None:
    global _PACKED_MASK
    if config is not None and not torch.compiler.is_compiling():
        _PACKED_MASK = (weakref.ref(config), packed)


def _packed_mask_for(module) -> bool:
    config = getattr(module, "config", None)
    return (_PACKED_MASK is not None and config is not None and _PACKED_MASK[0]() is config
            and _PACKED_MASK[1])


def _positions_restart(position_ids: torch.Tensor) -> bool:
    """Whether (batch, seqlen) position_ids hold more than one sequence per row, as transformers'
    padding-free collators pack them ([0, 1, 2, 0, 1, ...]). Other ranks (multimodal rotary
    positions) are not sequence boundaries and are left alone."""
    global _CONSECUTIVE
    if position_ids.dim() != 2 or position_ids.shape[-1] < 2:
        return False
    # Inference tensors keep no version counter, and traced ones no identity worth keeping.
    remember = not (torch.compiler.is_compiling() or position_ids.is_inference())
    if remember and _CONSECUTIVE is not None:
        ref, version = _CONSECUTIVE
        if ref() is position_ids and version == position_ids._version:
            return False
    restarts = bool((position_ids.diff(dim=-1) != 1).any())
    if remember and not restarts:
        _CONSECUTIVE = (weakref.ref(position_ids), position_ids._version)
    return restarts


def _offsets_of(row_ids: torch.Tensor, step: int) -> tuple[torch.Tensor, int]:
    """(cu_seqlens int32, longest document) of one row of ids packing documents, a document
    starting wherever the id does not step by `step`: 1 for position_ids ([0, 1, 2, 0, 1]), 0
    for a collator's seq_idx ([0, 0, 0, 1, 1]). Reads the longest on the host, once per tensor
    (every layer of a forward gets the same one)."""
    version = None if row_ids.is_inference() else row_ids._version
    known = _OFFSETS.get(step)
    if version is not None and known is not None and known[0]() is row_ids and known[1] == version:
        return known[2]
    row = row_ids[0]
    starts = torch.nonzero(row.diff() != step).flatten() + 1
    cu = torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), row.numel())])
    cu = cu.to(torch.int32)
    value = (cu, int(cu.diff().max()))
    if version is not None:
        _OFFSETS[step] = (weakref.ref(row_ids), version, value)
    return value


_OFFSETS: dict[int, tuple] = {}

# The last (seq_idx, cu_seqlens) pair found to agree, so that the check syncs once a forward.
_AGREED: tuple[weakref.ref, weakref.ref] | None = None


def _check_seq_idx(seq_idx: torch.Tensor, cu: torch.Tensor) -> None:
    """ValueError unless a collator's seq_idx marks the documents the pack's offsets do (the
    attention reads the offsets; seq_idx is for the model's other layers). Not while
    torch.compile traces."""
    global _AGREED
    if torch.compiler.is_compiling():
        return
    if _AGREED is not None and _AGREED[0]() is seq_idx and _AGREED[1]() is cu:
        return
    theirs, _ = _offsets_of(seq_idx, 0)
    if theirs.shape != cu.shape or not torch.equal(theirs, cu.to(theirs)):
        raise _refuse(f"seq_idx marks documents at {theirs.tolist()[:8]}... but the pack's "
                      f"offsets are {cu.tolist()[:8]}...: pass the collator's seq_idx with its "
                      f"own cu_seq_lens / position_ids")
    _AGREED = (weakref.ref(seq_idx), weakref.ref(cu))


def _pack_of(query, key, kwargs) -> tuple | None:
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) where the call packs documents into one row
    (the cu_seq_lens kwargs, position_ids that restart, or a collator's seq_idx), else None;
    ValueError where a pack comes in a form dashgen cannot serve. A seq_idx beside the other
    forms (hybrid models' collators send both) must mark the same documents."""
    cu_q = kwargs.get("cu_seq_lens_q")
    position_ids = kwargs.get("position_ids")
    seq_idx = kwargs.get("seq_idx")
    restarts = isinstance(position_ids, torch.Tensor) and _positions_restart(position_ids)
    if cu_q is None and not restarts and seq_idx is None:
        if kwargs.get("cu_seq_lens_k") is not None:
            raise _refuse("cu_seq_lens_k without cu_seq_lens_q: pass both (or neither)")
        return None
    if query.shape[0] != 1:
        raise _refuse(f"a padding-free pack is one row; the queries have {query.shape[0]} rows "
                      f"(batch the documents into one row)")
    if seq_idx is not None and (not isinstance(seq_idx, torch.Tensor) or seq_idx.dim() != 2
                                or tuple(seq_idx.shape) != (1, query.shape[2])):
        raise _refuse(f"seq_idx: a pack's document index is (1, {query.shape[2]}), one a "
                      f"query, got {getattr(seq_idx, 'shape', seq_idx)!r}")
    if cu_q is not None:
        cu_k = kwargs.get("cu_seq_lens_k")
        cu_k = cu_q if cu_k is None else cu_k
        max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
        if max_q is None or max_k is None:
            raise _refuse("cu_seq_lens_q: max_length_q and max_length_k must come with it")
        pack = cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)
        if seq_idx is not None:
            _check_seq_idx(seq_idx, cu_q)
        return pack
    if key.shape[2] != query.shape[2]:
        what = "position_ids restart" if restarts else "seq_idx marks documents"
        raise _refuse(f"{what} within a row (packed documents) but the keys ({key.shape[2]}) "
                      f"are not the queries ({query.shape[2]}): a cache does not go with a pack")
    cu, longest = _offsets_of(position_ids, 1) if restarts else _offsets_of(seq_idx, 0)
    if restarts and seq_idx is not None:
        _check_seq_idx(seq_idx, cu)
    return cu, cu, longest, longest


# -- the attention function ----------------------------------------------------------------------

def _support_error(module, attention_mask, dropout, kwargs) -> str | None:
    """Why dashgen cannot serve a call, or None (the tensors are dashgen.attention's checks).
    A 2-D mask is padding, served by unpadding (its values are padded_batch's checks)."""
    if attention_mask is not None and attention_mask.dim() != 2:
        return (f"attention_mask: the batch has a custom mask of shape "
                f"{tuple(attention_mask.shape)}, and dashgen takes none but padding "
                f"(batch, seqlen_k); use attn_implementation=\"sdpa\" for it")
    if attention_mask is not None:
        for name in ("cu_seq_lens_q", "seq_idx"):
            if kwargs.get(name) is not None:
                return (f"attention_mask with {name}: a padded batch or a padding-free pack, "
                        f"not both (pass one)")
    if kwargs.get("position_bias") is not None:
        return "position_bias: dashgen adds no bias to the scores"
    if dropout != 0.0:
        # transformers' modules pass their dropout only in training; sdpa and FlashAttention
        # would apply a nonzero rate whenever it came, so it is refused, never ignored.
        return (f"dropout: dashgen has no dropout, got {dropout} (module.training is "
                f"{getattr(module, 'training', None)}); set the model's attention dropout to 0")
    return None


def _mask_function_missing(module) -> str | None:
    """The implementation name a module runs under when no mask function is registered for it:
    transformers then passes attention_mask=None whatever the padding."""
    name = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if masking_utils is None or not isinstance(name, str):
        return None
    return None if name in masking_utils.ALL_MASK_ATTENTION_FUNCTIONS else name


def dashgen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls for attn_implementation="dashgen", with the
    contract of its sdpa_attention_forward: query (batch, heads_q, seqlen_q, head_dim), key and
    value (batch, heads_kv, seqlen_k, head_dim); returns (attn_output, None), attn_output
    (batch, seqlen_q, heads_q, head_dim) and no attention weights.

    Causal where kwargs["is_causal"] says so, else where module.is_causal does (True when the
    module has none), bottom-right aligned as FlashAttention's: with a cache, the last query
    row sees every key. scaling is the softmax scale (None: 1/sqrt(head_dim)). attention_mask
    is None (whole sequences, what dashgen_mask returns without padding) or the (batch,
    seqlen_k) padding mask, boolean or 0/1 (True or 1 keeps a key): each row's kept tokens run
    as one sequence, the queries being the last seqlen_q positions, and padded query positions
    come back as zeros. Other masks, dropout and the options dashgen lacks raise ValueError.
    """
    missing = _mask_function_missing(module)
    if missing is not None:
        raise _refuse(f"attention_mask: no mask function is registered for {missing!r}, so "
                      f"transformers would hide padding from dashgen; call "
                      f"dashgen.interfaces.transformers.register() (or register dashgen_mask "
                      f"with transformers.AttentionMaskInterface under {missing!r})")
    error = _support_error(module, attention_mask, dropout, kwargs)
    if error is not None:
        raise _refuse(error)
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    # One query row sees every key either way (bottom-right alignment), and the full mask is
    # the simpler problem: decoding steps run unmasked, as in sdpa_attention_forward.
    causal = bool(is_causal) and query.shape[2] > 1
    # Gemma 2's attention-logit cap arrives as softcap (None or 0: none), flash_attn's meaning.
    softcap = kwargs.get("softcap") or 0.0
    window = _window_of(module, kwargs)
    chunk = _chunk_of(module)
    # GPT-OSS's learned sinks arrive as s_aux (one logit per query head).
    sinks = kwargs.get("s_aux") if kwargs.get("s_aux") is not None else kwargs.get("sinks")
    query, key, value = _kernel_dtype(module, query, key, value)
    if attention_mask is not None:
        # A padded batch's position_ids restart too (left padding): the mask says where its
        # sequences are, as it does for transformers' own flash-attention path.
        try:
            rows = padded_batch(attention_mask, query.shape[2], key.shape[2])
        except ValueError as error:
            raise _refuse(str(error)) from None
        return _attend_padded(rows, query, key, value, scaling, causal=causal, softcap=softcap,
                              window_size=window, sinks=sinks, attention_chunk=chunk), None
    pack = _pack_of(query, key, kwargs)
    if pack is None and _packed_mask_for(module):
        raise _refuse("position_ids pack documents into this row (transformers' mask says so), "
                      "but the model's layers do not hand them to the attention; pass "
                      "cu_seq_lens_q/k with max_length_q/k (DataCollatorWithFlattening("
                      "return_flash_attn_kwargs=True)), or unpacked sequences")
    # A head_dim up to 256 without a kernel of its own runs zero-padded into the next served
    # one, as under attn_implementation="flash_attention_2" (run_padded).
    if pack is not None:
        from ..runtime.op_varlen import attention_varlen
        out, _ = run_padded(
            lambda q, k, v, scale: (attention_varlen(
                q, k, v, *pack, causal=bool(is_causal), softmax_scale=scale, softcap=softcap,
                window_size=window, sinks=sinks, attention_chunk=chunk), None),
            query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1),
            scaling)
        return out[None], None
    out, _ = run_padded(
        lambda q, k, v, scale: (op.attention(
            q, k, v, causal=causal, softmax_scale=scale, softcap=softcap, window_size=window,
            sinks=sinks, attention_chunk=chunk), None),
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), scaling)
    return out, None


def _attend_padded(rows: Unpadded, query, key, value, scaling, **options) -> torch.Tensor:
    """attention_varlen over a padded batch's kept tokens (transformers' layout in and out):
    (batch, seqlen_q, heads_q, head_dim_v), zeros at padded queries."""
    from ..runtime.op_varlen import attention_varlen

    def packed(q, k, v):
        return run_padded(
            lambda q, k, v, scale: (attention_varlen(q, k, v, *rows.varlen_args(),
                                                     softmax_scale=scale, **options), None),
            q, k, v, scaling)[0]

    return rows.attend(packed, *(t.transpose(1, 2) for t in (query, key, value)))


def _kernel_dtype(module, query, key, value):
    """query, key and value in a dtype the kernels take, by transformers' own rule for its
    flash-attention path (get_target_dtype): a float32 query, which a float32 norm or rotary
    gives under torch.autocast (Qwen3's q/k norms with float32 weights), takes key and value
    with it to the autocast dtype, else to a quantized model's dtype, else to the dtype of the
    model's first nn.Linear weight. Where that is float32 too, the call is refused: the kernels
    take bfloat16 and float16 only."""
    if query.dtype != torch.float32:
        return query, key, value
    device = query.device.type
    if torch.is_autocast_enabled(device):
        target = torch.get_autocast_dtype(device)
    elif hasattr(getattr(module, "config", None), "_is_quantized"):
        target = module.config.dtype
    else:
        modules = module.modules() if isinstance(module, torch.nn.Module) else ()
        target = next((m.weight.dtype for m in modules if isinstance(m, torch.nn.Linear)),
                      torch.float32)
    if target not in (torch.bfloat16, torch.float16):
        raise _refuse(f"query is float32 and transformers' rule casts it to {target} (no "
                      f"torch.autocast, float32 weights): dashgen's kernels take bfloat16 and "
                      f"float16; load the model in one (dtype=torch.bfloat16) or run it under "
                      f"torch.autocast")
    return query.to(target), key.to(target), value.to(target)


def _chunk_of(module) -> int:
    """The layer's attention chunk (Llama 4's chunked layers: config.layer_types names the
    layer "chunked_attention", config.attention_chunk_size the chunk), 0 for any other layer:
    the rule by which the model picks the chunked mask for a layer, so the attention and the
    mask dashgen_mask accepted agree."""
    config = getattr(module, "config", None)
    types, index = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if not isinstance(index, int) or not types or index >= len(types) \
            or types[index] != "chunked_attention":
        return 0
    chunk = getattr(config, "attention_chunk_size", None)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise _refuse(f"attention_chunk_size must be a positive int for a chunked_attention "
                      f"layer, got {chunk!r}")
    return chunk


def _window_of(module, kwargs) -> tuple[int, int]:
    """FlashAttention's window_size for the layer's sliding window (the sliding_window kwarg,
    else the module's; None: none): a query sees the sliding_window keys up to its own,
    (W - 1, W - 1) as transformers hands it to flash_attn, the causal mask making the right
    bound 0."""
    window = kwargs.get("sliding_window")
    if window is None:
        window = getattr(module, "sliding_window", None)
    if window is None:
        return (-1, -1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise _refuse(f"sliding_window must be a positive int or None, got {window!r}")
    return (window - 1, window - 1)


# -- the mask function ---------------------------------------------------------------------------

def dashgen_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                 mask_function=None, attention_mask: torch.Tensor | None = None,
                 allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False,
                 **kwargs) -> torch.Tensor | None:
    """transformers' mask function for "dashgen" (AttentionMaskInterface), called once per
    forward by create_causal_mask and its siblings. Returns None where dashgen's own masks serve
    the model: plain causal attention whose last query meets the last key (under a sliding
    window or Llama 4's chunks too, which dashgen_attention takes from the layer; documents
    packed by position_ids as well), or plain full attention, with no padding among the keys;
    that None reaches dashgen_attention, which takes causality from the module. Returns the
    (batch, kv_length) boolean padding mask where some key is padding, which
    dashgen_attention unpads into a pack. Raises ValueError for a pattern dashgen has no kernel
    for: any other mask function (a bidirectional pack, a model's overlays), a caller that
    needs a mask tensor, or a cache whose keys run past the queries (a static cache's unfilled
    slots) or, under chunks, start past position 0."""
    packed = _packed_causal(mask_function)
    _note_packed_mask(kwargs.get("config"), packed)
    if packed:
        # Documents packed by position_ids (found by transformers, or under torch.compile
        # assumed, since it cannot look while tracing): causal within each document, which
        # dashgen_attention serves from the position_ids (or the cu_seq_lens kwargs) itself.
        # The packed-sequence mask alone turns the causal skip off.
        mask_function, allow_is_causal_skip = masking_utils.causal_mask_function, True
    if _sliding_causal(mask_function):
        # A sliding window over the causal mask: dashgen_attention takes the window from the
        # layer (its sliding_window), so the mask's checks are the causal one's.
        mask_function = masking_utils.causal_mask_function
    if _chunked_causal(mask_function):
        # Llama 4's chunks over the causal mask: dashgen_attention takes the chunk from the
        # layer (_chunk_of). transformers counts chunks from position 0 of the keys, dashgen
        # from the first key it is given, so the keys must start there.
        if kv_offset != 0:
            raise _refuse(f"chunked attention over keys from position {kv_offset} (a sliding "
                          f"cache): dashgen counts chunks from the first key it is given; run "
                          f"the whole sequence, or use a DynamicCache")
        mask_function = masking_utils.causal_mask_function
    if mask_function is None or mask_function is masking_utils.causal_mask_function:
        if not allow_is_causal_skip:
            raise _refuse("allow_is_causal_skip=False: the model needs a causal mask tensor "
                          "(to combine with a bias, or for a compiled static-cache decode), and "
                          "dashgen takes none")
        q_end = int(q_offset) + q_length  # a StaticCache hands q_offset over as a tensor
        if q_end != kv_offset + kv_length:
            raise _refuse(f"the queries end at position {q_end} but the keys at "
                          f"{kv_offset + kv_length} (a static cache's unfilled slots?); "
                          f"dashgen's causal mask aligns the last query with the last key, use "
                          f"a DynamicCache")
    elif mask_function is masking_utils.bidirectional_mask_function:
        if not allow_is_bidirectional_skip:
            raise _refuse("allow_is_bidirectional_skip=False: the model needs a mask tensor, "
                          "and dashgen takes none")
    else:
        raise _refuse(f"mask_function: the model asks for a mask other than plain causal or "
                      f"full attention ({getattr(mask_function, '__name__', mask_function)}: a "
                      f"bidirectional pack or a model-specific pattern); dashgen serves causal "
                      f"(with a layer's sliding window or chunks) or full attention, and causal "
                      f"documents packed into one row")
    if attention_mask is None:
        return None
    # Keys past the end of the 2-D mask count as padding, as in transformers' own masks.
    padding = masking_utils.prepare_padding_mask(attention_mask, kv_length, kv_offset)
    padding = padding[:, kv_offset:kv_offset + kv_length]
    return None if bool(padding.all()) else padding


def _and_mask_parts(mask_function) -> tuple:
    """The mask functions transformers' and_masks(...) combined, () for any other function."""
    if getattr(mask_function, "__name__", "") != "and_mask":
        return ()
    return next((cell.cell_contents for cell in mask_function.__closure__ or ()
                 if isinstance(cell.cell_contents, tuple)), ())


def _overlay_on_causal(mask_function, overlay: str) -> bool:
    """Whether mask_function is and_masks(overlay(...), causal_mask_function), the overlay
    named by its function's name in transformers' masking_utils."""
    parts = _and_mask_parts(mask_function)
    return (len(parts) == 2 and parts[1] is masking_utils.causal_mask_function
            and getattr(parts[0], "__qualname__", "").startswith(overlay + "."))


def _sliding_causal(mask_function) -> bool:
    """Whether mask_function is transformers' sliding_window_causal_mask_function(W)."""
    return _overlay_on_causal(mask_function, "sliding_window_overlay")


def _chunked_causal(mask_function) -> bool:
    """Whether mask_function is transformers' chunked_causal_mask_function(C, left_padding).
    Left padding shows as padding in the mask: unpadded, each row's chunks count from its
    first kept key, as transformers' left_padding offset counts them."""
    return _overlay_on_causal(mask_function, "chunked_overlay")


def _packed_causal(mask_function) -> bool:
    """Whether mask_function is what transformers builds for a causal model whose position_ids
    pack documents: and_masks(causal, packed_sequence_mask_function(...)), the causal part
    causal_mask_function, or since transformers 5.2x that function with its indices remapped to
    each document's positions (remap_positions_for_packed_sequence). A sliding window's causal
    part counts too (each document's window from its own start, as attention_varlen's); a
    chunked one is refused (ValueError)."""
    parts = _and_mask_parts(mask_function)
    if len(parts) != 2 or not getattr(parts[1], "__qualname__", "").startswith(
            "packed_sequence_mask_function."):
        return False
    causal = parts[0]
    if getattr(causal, "__qualname__", "").startswith("remap_positions_for_packed_sequence."):
        causal = next((cell.cell_contents for cell in causal.__closure__ or ()
                       if callable(cell.cell_contents)), None)
    if _chunked_causal(causal):
        # Llama 4's decoder layers keep position_ids from the attention, so dashgen_attention
        # could not see the documents and would chunk the row as one sequence.
        raise _refuse("chunked attention over documents packed by position_ids: the model's "
                      "layers do not hand position_ids to the attention (Llama 4's do not), "
                      "so dashgen cannot see the documents; run unpacked sequences")
    return causal is masking_utils.causal_mask_function or _sliding_causal(causal)


def register() -> str:
    """Register "dashgen" with transformers.AttentionInterface and AttentionMaskInterface, and
    return the name (for attn_implementation=). Registering again is harmless. Raises
    ImportError without transformers 5 or newer."""
    _require_transformers()
    transformers.AttentionInterface.register(IMPL_NAME, dashgen_attention)
    transformers.AttentionMaskInterface.register(IMPL_NAME, dashgen_mask)
    return IMPL_NAME
