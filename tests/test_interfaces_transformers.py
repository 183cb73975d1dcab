"""dashgen as a transformers attention implementation, on the CPU: dashgen_attention's layout
contract (transformers' (batch, heads, seqlen, head_dim) in, (batch, seqlen, heads, head_dim)
out), GQA without repeated heads, every refusal, the mask function's answers, and a tiny Llama
built with attn_implementation="dashgen" running forward, backward and generate. The driver
boundary is faked as in test_op_errors (op._kernels); the GPU test runs the real kernels."""
from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers import masking_utils  # noqa: E402

from dashgen.interfaces import transformers as hf  # noqa: E402
from test_op_errors import (  # noqa: E402,F401  (fixtures by name)
    BF16, fake_gradients, h200, kernels, on_cpu, restore_determinism, varlen)


def bhsd_leaves(batch=2, heads_q=8, heads_kv=2, seqlen_q=100, seqlen_k=100, head_dim=64):
    """Leaves in transformers' layout over (batch, seqlen, heads, head_dim) memory, as its
    attention modules make them: proj(x).view(...).transpose(1, 2)."""
    torch.manual_seed(0)
    return tuple(torch.randn(batch, s, h, head_dim, dtype=BF16).transpose(1, 2).requires_grad_()
                 for h, s in ((heads_q, seqlen_q), (heads_kv, seqlen_k), (heads_kv, seqlen_k)))


def attention_module(is_causal=True, training=False, **attributes):
    """What dashgen_attention reads of transformers' attention modules."""
    return SimpleNamespace(is_causal=is_causal, training=training, **attributes)


@pytest.fixture
def registered():
    hf.register()


def forwards(kernels):
    return [options for name, options in kernels.calls if name == "forward"]


# -- registration --------------------------------------------------------------------------------

def test_register_adds_the_attention_and_mask_functions_and_may_run_twice():
    assert hf.register() == "dashgen"
    assert hf.register() == "dashgen"
    assert transformers.AttentionInterface._global_mapping["dashgen"] is hf.dashgen_attention
    assert transformers.AttentionMaskInterface._global_mapping["dashgen"] is hf.dashgen_mask


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_importing_dashgen_registers_nothing():
    result = run_python(
        "import dashgen, dashgen.interfaces.transformers\n"
        "import transformers\n"
        "assert 'dashgen' not in transformers.AttentionInterface._global_mapping\n"
        "assert 'dashgen' not in transformers.AttentionMaskInterface._global_mapping\n")
    assert result.returncode == 0, result.stderr


def test_register_without_transformers_says_how_to_install_it():
    result = run_python(
        "import sys\n"
        "sys.modules['transformers'] = None  # as if it were not installed\n"
        "import dashgen.interfaces.transformers as hf\n"
        "try:\n"
        "    hf.register()\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('register() did not raise')\n")
    assert result.returncode == 0, result.stderr
    assert "pip install 'transformers>=5'" in result.stdout


# -- the attention function ------------------------------------------------------------------------

def test_output_is_the_kernels_output_in_transformers_layout(on_cpu, kernels):
    q, k, v = bhsd_leaves()
    out, weights = hf.dashgen_attention(attention_module(), q, k, v, None, scaling=0.25)
    ref_o, _ = kernels.forward(*(t.detach().transpose(1, 2).contiguous() for t in (q, k, v)),
                               causal=True, softmax_scale=0.25)
    assert weights is None
    assert out.shape == (2, 100, 8, 64)  # (batch, seqlen, heads, head_dim), as sdpa returns it
    assert torch.equal(out.detach(), ref_o)
    do = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
    want = fake_gradients(do, *(t.transpose(1, 2) for t in (q, k, v)))
    for got, ref in zip((dq, dk, dv), want):
        assert torch.equal(got, ref.transpose(1, 2))


def test_float32_inputs_take_transformers_flash_attention_dtype(on_cpu, kernels):
    """transformers' rule for float32 inputs on its flash-attention path: under autocast q, k
    and v go to the autocast dtype (the output in it, gradients back in float32), else to the
    model's first Linear weight dtype; a float32 model outside autocast is refused by name."""
    q, k, v = (t.detach().float().requires_grad_() for t in bhsd_leaves())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = hf.dashgen_attention(attention_module(), q, k, v, None)
    assert out.dtype == torch.bfloat16 and kernels.forward_calls[-1][2] == torch.bfloat16
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == torch.float32 for g in grads)
    half = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.float16))
    half.is_causal, half.training = True, False
    out, _ = hf.dashgen_attention(half, q, k, v, None)
    assert out.dtype == torch.float16 and kernels.forward_calls[-1][2] == torch.float16
    calls = len(kernels.calls)
    with pytest.raises(ValueError, match=r"query is float32 and transformers' rule casts it to "
                                         r"torch.float32 \(no torch.autocast"):
        hf.dashgen_attention(attention_module(), q, k, v, None)
    assert len(kernels.calls) == calls


def test_gqa_hands_key_and_value_over_with_their_own_heads(on_cpu, kernels, monkeypatch):
    seen = []
    forward = kernels.forward

    def spy(q, k, v, **options):
        seen.append((q.shape, k.shape, v.shape))
        return forward(q, k, v, **options)

    monkeypatch.setattr(kernels, "forward", spy)
    q, k, v = bhsd_leaves(heads_q=8, heads_kv=2)
    hf.dashgen_attention(attention_module(num_key_value_groups=4), q, k, v, None)
    assert seen == [((2, 100, 8, 64), (2, 100, 2, 64), (2, 100, 2, 64))]
    # The projections' memory went to the kernels as it was: no repeat_kv, no copy.
    assert kernels.prepared[0][:3] == tuple(t.data_ptr() for t in (q, k, v))


@pytest.mark.parametrize("module_causal, kwargs, seqlen_q, causal", [
    (True, {}, 100, True),
    (False, {}, 100, False),
    (True, dict(is_causal=False), 100, False),  # the kwarg overrides the module
    (False, dict(is_causal=True), 100, True),
    (True, {}, 1, False),  # a decoding step sees every key: no mask to apply
])
def test_causality_follows_is_causal_then_the_module(on_cpu, kernels, module_causal, kwargs,
                                                     seqlen_q, causal):
    q, k, v = bhsd_leaves(seqlen_q=seqlen_q, seqlen_k=100)
    hf.dashgen_attention(attention_module(is_causal=module_causal), q, k, v, None, **kwargs)
    assert forwards(kernels) == [dict(causal=causal, softmax_scale=1 / 8)]


def test_a_cache_longer_than_the_queries_is_bottom_right_causal(on_cpu, kernels):
    q, k, v = bhsd_leaves(seqlen_q=30, seqlen_k=100)
    out, _ = hf.dashgen_attention(attention_module(), q, k, v, None, scaling=0.5)
    assert out.shape == (2, 30, 8, 64)
    assert forwards(kernels) == [dict(causal=True, softmax_scale=0.5)]


def test_backward_follows_the_deterministic_flag(on_cpu, kernels, restore_determinism):
    for flag in (True, False):
        torch.use_deterministic_algorithms(flag)
        q, k, v = bhsd_leaves()
        hf.dashgen_attention(attention_module(), q, k, v, None)[0].sum().backward()
        prepared = [options for name, options in kernels.calls if name == "prepare"]
        assert prepared[-1]["deterministic"] is flag


@pytest.mark.parametrize("module, mask, kwargs, pattern", [
    (attention_module(), torch.zeros(2, 100), {},
     r"attention_mask: a padding mask is boolean or integer .* got torch.float32"),
    (attention_module(), torch.ones(2, 100, dtype=torch.bool),
     dict(cu_seq_lens_q=torch.tensor([0, 50, 100])),
     r"attention_mask with cu_seq_lens_q: a padded batch or a padding-free pack"),
    (attention_module(), torch.ones(2, 1, 100, 100, dtype=torch.bool), {},
     r"attention_mask: the batch has a custom mask of shape \(2, 1, 100, 100\)"),
    (attention_module(), None, dict(cu_seq_lens_q=torch.tensor([0, 50, 100])),
     r"a padding-free pack is one row; the queries have 2 rows"),
    (attention_module(), None, dict(cu_seq_lens_k=torch.tensor([0, 50, 100])),
     r"cu_seq_lens_k without cu_seq_lens_q"),
    (attention_module(), None,
     dict(position_ids=torch.cat([torch.arange(60), torch.arange(40)])[None].expand(2, -1)),
     r"a padding-free pack is one row"),
    (attention_module(), None, dict(seq_idx=torch.zeros(2, 100, dtype=torch.int32)),
     r"a padding-free pack is one row; the queries have 2 rows"),
    (attention_module(), torch.ones(2, 100, dtype=torch.bool),
     dict(seq_idx=torch.zeros(2, 100, dtype=torch.int32)),
     r"attention_mask with seq_idx: a padded batch or a padding-free pack"),
    (attention_module(sliding_window=0), None, {}, r"sliding_window must be a positive int"),
    (attention_module(training=True), None, dict(dropout=0.1),
     r"dropout: dashgen has no dropout, got 0.1 \(module.training is True\)"),
    (attention_module(), None, dict(position_bias=torch.zeros(1, 8, 100, 100)),
     r"position_bias: "),
])
def test_refusals_name_the_argument_before_any_kernel(on_cpu, kernels, module, mask, kwargs,
                                                      pattern):
    q, k, v = bhsd_leaves()
    with pytest.raises(ValueError, match=r'^attn_implementation="dashgen": ' + pattern):
        hf.dashgen_attention(module, q, k, v, mask, **kwargs)
    assert kernels.calls == []


def test_options_left_at_their_defaults_are_accepted(on_cpu, kernels):
    q, k, v = bhsd_leaves()
    hf.dashgen_attention(attention_module(sliding_window=None), q, k, v, None, dropout=0.0,
                         sliding_window=None, softcap=None, s_aux=None, cu_seq_lens_q=None,
                         position_ids=torch.arange(100)[None].expand(2, -1), use_cache=True)
    assert len(forwards(kernels)) == 1


def test_position_ids_are_checked_again_after_an_in_place_change(on_cpu, kernels, varlen):
    q, k, v = bhsd_leaves(batch=1)
    positions = torch.arange(100)[None].clone()
    hf.dashgen_attention(attention_module(), q, k, v, None, position_ids=positions)
    positions[0, 60:] -= 60  # now documents of 60 and 40
    hf.dashgen_attention(attention_module(), q, k, v, None, position_ids=positions)
    assert len(forwards(kernels)) == 1
    assert [(c["cu_q"], c["max_q"], c["causal"]) for c in varlen] == [([0, 60, 100], 60, True)]


def test_a_pack_runs_per_document_in_transformers_layout(on_cpu, kernels, varlen):
    q, k, v = bhsd_leaves(batch=1)
    positions = torch.cat([torch.arange(30), torch.arange(1), torch.arange(69)])[None]
    out, weights = hf.dashgen_attention(attention_module(), q, k, v, None,
                                        position_ids=positions, scaling=0.125)
    assert weights is None and out.shape == (1, 100, 8, 64) and kernels.calls == []
    assert varlen == [dict(q=(100, 8, 64), k=(100, 2, 64), cu_q=[0, 30, 31, 100],
                           cu_k=[0, 30, 31, 100], max_q=69, max_k=69, causal=True)]
    # Each document alone: the same rows as attention over that document only.
    alone = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, 31:].float(), k[:, :, 31:].float().repeat_interleave(4, 1),
        v[:, :, 31:].float().repeat_interleave(4, 1), is_causal=True, scale=0.125)
    assert torch.allclose(out[0, 31:].float(), alone[0].transpose(0, 1), atol=1e-2)


def test_collator_offsets_are_taken_as_given(on_cpu, kernels, varlen):
    q, k, v = bhsd_leaves(batch=1)
    cu = torch.tensor([0, 50, 100], dtype=torch.int32)
    hf.dashgen_attention(attention_module(), q, k, v, None, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                         max_length_q=50, max_length_k=50)
    assert varlen[0]["cu_q"] == [0, 50, 100] and varlen[0]["max_k"] == 50
    with pytest.raises(ValueError, match=r"max_length_q and max_length_k must come with it"):
        hf.dashgen_attention(attention_module(), q, k, v, None, cu_seq_lens_q=cu)


def seq_idx_of(*lengths):
    """A collator's seq_idx (return_seq_idx=True): each token's document, int32, one row."""
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)])[None]


def test_a_seq_idx_alone_packs_the_row(on_cpu, kernels, varlen):
    q, k, v = bhsd_leaves(batch=1)
    hf.dashgen_attention(attention_module(), q, k, v, None, seq_idx=seq_idx_of(30, 1, 69),
                         position_ids=torch.arange(100)[None])
    assert kernels.calls == []
    assert [(c["cu_q"], c["max_q"], c["causal"]) for c in varlen] == [([0, 30, 31, 100], 69,
                                                                        True)]


@pytest.mark.parametrize("form", ["cu_seq_lens", "position_ids"])
def test_a_seq_idx_beside_the_pack_must_mark_its_documents(on_cpu, kernels, varlen, form):
    """Hybrid models' collators (GraniteMoeHybrid's) send seq_idx beside the offsets: the
    attention runs the offsets where the two agree and names both where they do not."""
    q, k, v = bhsd_leaves(batch=1)
    cu = torch.tensor([0, 60, 100], dtype=torch.int32)
    pack = (dict(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=60, max_length_k=60)
            if form == "cu_seq_lens" else
            dict(position_ids=torch.cat([torch.arange(60), torch.arange(40)])[None]))
    hf.dashgen_attention(attention_module(), q, k, v, None, seq_idx=seq_idx_of(60, 40), **pack)
    assert [c["cu_q"] for c in varlen] == [[0, 60, 100]]
    with pytest.raises(ValueError, match=r"seq_idx marks documents at \[0, 50, 100\].* but the "
                                         r"pack's offsets are \[0, 60, 100\]"):
        hf.dashgen_attention(attention_module(), q, k, v, None, seq_idx=seq_idx_of(50, 50),
                             **pack)
    with pytest.raises(ValueError, match=r"seq_idx: a pack's document index is \(1, 100\)"):
        hf.dashgen_attention(attention_module(), q, k, v, None,
                             seq_idx=seq_idx_of(60, 40)[0], **pack)
    assert len(varlen) == 1


def test_a_name_without_a_mask_function_is_refused(on_cpu, kernels, registered):
    # Without a mask function transformers passes attention_mask=None whatever the padding.
    q, k, v = bhsd_leaves()
    lone = attention_module(config=SimpleNamespace(_attn_implementation="dashgen-unmasked"))
    with pytest.raises(ValueError, match=r"attention_mask: no mask function is registered for "
                                         r"'dashgen-unmasked'.*register\(\)"):
        hf.dashgen_attention(lone, q, k, v, None)
    known = attention_module(config=SimpleNamespace(_attn_implementation="dashgen"))
    hf.dashgen_attention(known, q, k, v, None)
    assert len(forwards(kernels)) == 1


# -- the mask function -----------------------------------------------------------------------------

CAUSAL = masking_utils.causal_mask_function
FULL = masking_utils.bidirectional_mask_function


@pytest.mark.parametrize("q_length, kv_length, q_offset", [(10, 10, 0), (1, 11, 10), (4, 11, 7)])
def test_mask_is_none_for_causal_attention_without_padding(q_length, kv_length, q_offset):
    for mask in (None, torch.ones(2, kv_length, dtype=torch.bool)):
        assert hf.dashgen_mask(batch_size=2, q_length=q_length, kv_length=kv_length,
                               q_offset=q_offset, mask_function=CAUSAL, attention_mask=mask,
                               allow_is_causal_skip=True) is None


def test_mask_is_none_for_full_attention_without_padding():
    assert hf.dashgen_mask(batch_size=2, q_length=10, kv_length=10, mask_function=FULL,
                           attention_mask=torch.ones(2, 10, dtype=torch.bool),
                           allow_is_causal_skip=False, allow_is_bidirectional_skip=True) is None


@pytest.mark.parametrize("mask_function, skips", [
    (CAUSAL, dict(allow_is_causal_skip=True)),
    (FULL, dict(allow_is_causal_skip=False, allow_is_bidirectional_skip=True)),
])
def test_mask_is_the_padding_of_the_keys_where_there_is_some(mask_function, skips):
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, :3] = False  # left padding
    got = hf.dashgen_mask(batch_size=2, q_length=10, kv_length=10, mask_function=mask_function,
                          attention_mask=mask, **skips)
    assert torch.equal(got, mask)
    # Keys the 2-D mask does not reach are padding too.
    got = hf.dashgen_mask(batch_size=2, q_length=1, kv_length=11, q_offset=10,
                          mask_function=mask_function, attention_mask=torch.ones(2, 10).bool(),
                          **skips)
    assert got.shape == (2, 11) and not got[:, 10].any() and got[:, :10].all()


def test_a_sliding_window_over_the_causal_mask_is_left_to_the_attention(on_cpu, kernels, varlen):
    """transformers' sliding-window causal mask function: dashgen_mask answers as for the
    causal mask (None without padding); dashgen_attention takes the layer's sliding_window W
    as FlashAttention's window_size (W - 1, 0), packed documents included."""
    sliding = masking_utils.sliding_window_causal_mask_function(4)
    assert hf.dashgen_mask(batch_size=1, q_length=10, kv_length=10,
                           mask_function=sliding) is None
    q, k, v = bhsd_leaves()
    hf.dashgen_attention(attention_module(sliding_window=32), q, k, v, None)
    assert forwards(kernels)[-1]["window"] == (31, 0)
    sinks = torch.zeros(8, requires_grad=True)
    hf.dashgen_attention(attention_module(sliding_window=32), q, k, v, None, s_aux=sinks)
    assert forwards(kernels)[-1]["window"] == (31, 0)  # GPT-OSS's layers: window and sinks
    q, k, v = bhsd_leaves(batch=1)
    hf.dashgen_attention(attention_module(sliding_window=32), q, k, v, None,
                         position_ids=torch.cat([torch.arange(60), torch.arange(40)])[None])
    # flash_attn's form, (W - 1, W - 1) under causal: attention_varlen's checks.window takes the
    # right bound to 0 there, as FlashAttention does.
    assert varlen[-1]["cu_q"] == [0, 60, 100] and varlen[-1]["causal"]
    assert varlen[-1]["window_size"] == (31, 31)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(mask_function=masking_utils.and_masks(CAUSAL, lambda b, h, q, k: q - k < 7)),
     r"mask_function: the model asks for a mask other than plain causal or full attention"),
    (dict(mask_function=masking_utils.chunked_causal_mask_function(
        4, torch.zeros(1, dtype=torch.long)), q_offset=6, kv_offset=6),
     r"chunked attention over keys from position 6 \(a sliding cache\)"),
    (dict(mask_function=CAUSAL, allow_is_causal_skip=False), r"allow_is_causal_skip=False"),
    (dict(mask_function=FULL, allow_is_bidirectional_skip=False),
     r"allow_is_bidirectional_skip=False"),
    (dict(mask_function=CAUSAL, kv_length=32),  # a static cache: 10 queries, 32 key slots
     r"the queries end at position 10 but the keys at 32"),
])
def test_mask_refuses_patterns_dashgen_has_no_kernel_for(kwargs, pattern):
    arguments = dict(batch_size=1, q_length=10, kv_length=10, allow_is_causal_skip=True)
    arguments.update(kwargs)
    with pytest.raises(ValueError, match=r'^attn_implementation="dashgen": ' + pattern):
        hf.dashgen_mask(**arguments)


# -- a transformers model --------------------------------------------------------------------------

LAYERS = 2


@pytest.fixture
def llama(registered):
    config = transformers.LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=128, attn_implementation="dashgen")
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to(BF16)


def test_a_llama_runs_each_layer_on_dashgen_causal(on_cpu, kernels, llama):
    assert llama.config._attn_implementation == "dashgen"
    ids = torch.randint(0, 128, (2, 100))
    logits = llama(ids, use_cache=False).logits
    assert logits.shape == (2, 100, 128)
    assert forwards(kernels) == [dict(causal=True, softmax_scale=1 / 8)] * LAYERS
    logits.float().sum().backward()
    assert [name for name, _ in kernels.calls].count("call") == LAYERS  # one backward per layer
    for layer in llama.model.layers:
        for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
            assert proj.weight.grad is not None and proj.weight.grad.abs().sum() > 0


def test_a_llama_runs_a_mask_without_padding_on_the_fixed_length_kernels(on_cpu, kernels,
                                                                          varlen, llama):
    ids = torch.randint(0, 128, (2, 100))
    llama(ids, attention_mask=torch.ones(2, 100, dtype=torch.long))
    assert len(forwards(kernels)) == LAYERS and varlen == []


def padded_ids(batch=3, seqlen=100):
    """Row 0 padded on the left by 7, row 1 on the right by 30, row 2 whole."""
    ids = torch.randint(1, 128, (batch, seqlen))
    mask = torch.ones(batch, seqlen, dtype=torch.long)
    mask[0, :7] = 0
    mask[1, seqlen - 30:] = 0
    return ids, mask


def test_a_padded_llama_runs_each_row_as_a_sequence_and_matches_sdpa(on_cpu, kernels, varlen,
                                                                     llama):
    """Left and right padding: each layer runs the rows' kept tokens as one pack, and the
    logits at kept positions are sdpa's with the same mask (the packed kernels replaced by
    per-sequence float32 attention, so this checks the unpadding, not the kernels)."""
    ids, mask = padded_ids()
    logits = llama(ids, attention_mask=mask, use_cache=False).logits
    assert kernels.calls == [] and len(varlen) == LAYERS
    assert all(c["cu_q"] == c["cu_k"] == [0, 93, 163, 263] and c["causal"] for c in varlen)
    assert all(c["q"] == (263, 4, 64) and c["k"] == (263, 2, 64) for c in varlen)
    reference = transformers.LlamaForCausalLM(llama.config.__class__(
        **{**llama.config.to_dict(), "attn_implementation": "sdpa"})).to(BF16)
    reference.load_state_dict(llama.state_dict())
    expected = reference(ids, attention_mask=mask, use_cache=False).logits
    kept = mask.bool()
    err = (logits[kept].double() - expected[kept].double()).norm() / expected[kept].double().norm()
    assert err < 2e-2
    logits[kept].float().sum().backward()
    assert [name for name, _ in kernels.calls] == []  # the backward ran packed too
    assert llama.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0


def test_a_padded_rows_logits_do_not_depend_on_the_padding_tokens(on_cpu, kernels, varlen,
                                                                   llama):
    ids, mask = padded_ids()
    logits = llama(ids, attention_mask=mask, use_cache=False).logits
    other = ids.masked_fill(mask == 0, 5)
    again = llama(other, attention_mask=mask, use_cache=False).logits
    kept = mask.bool()
    assert torch.equal(logits[kept], again[kept])


def test_a_left_padded_llama_generates_through_a_cache(on_cpu, kernels, varlen, llama):
    llama.eval()
    ids, mask = padded_ids(batch=2, seqlen=20)
    mask[1] = 1  # generation pads on the left only
    out = llama.generate(ids, attention_mask=mask, max_new_tokens=2, do_sample=False,
                         pad_token_id=0)
    assert out.shape == (2, 22)
    # The prompt as a pack, then each new token's query over its row's kept keys.
    assert [c["cu_q"] for c in varlen] == [[0, 13, 33]] * LAYERS + [[0, 1, 2]] * LAYERS * 1
    assert [c["cu_k"] for c in varlen][LAYERS:] == [[0, 14, 35]] * LAYERS


def test_the_mask_of_packed_causal_documents_is_left_to_the_attention():
    packed = masking_utils.and_masks(
        CAUSAL, masking_utils.packed_sequence_mask_function(torch.tensor([[0] * 5 + [1] * 5])))
    assert hf.dashgen_mask(batch_size=1, q_length=10, kv_length=10, mask_function=packed,
                           allow_is_causal_skip=False) is None


@pytest.mark.parametrize("use_cache", [False, True])
def test_a_llama_runs_packed_position_ids_per_document(on_cpu, kernels, varlen, llama,
                                                       use_cache):
    ids = torch.randint(0, 128, (1, 100))
    packed = torch.cat([torch.arange(60), torch.arange(40)])[None]
    logits = llama(ids, position_ids=packed, use_cache=use_cache).logits
    assert kernels.calls == [] and len(varlen) == LAYERS
    assert all(c["cu_q"] == [0, 60, 100] and c["causal"] for c in varlen)
    # Another second document leaves the first one's logits as they were, bit for bit.
    other = ids.clone()
    other[:, 60:] = (other[:, 60:] + 1) % 128
    again = llama(other, position_ids=packed, use_cache=use_cache).logits
    assert torch.equal(again[:, :60], logits[:, :60])
    assert not torch.equal(again[:, 60:], logits[:, 60:])


def test_a_llama_generates_through_a_cache(on_cpu, kernels, llama):
    llama.eval()
    ids = torch.randint(0, 128, (2, 20))
    out = llama.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                         do_sample=False, pad_token_id=0)
    assert out.shape == (2, 23)
    # The prompt causal, then one unmasked step per new token against the grown cache.
    assert forwards(kernels) == ([dict(causal=True, softmax_scale=1 / 8)] * LAYERS
                                 + [dict(causal=False, softmax_scale=1 / 8)] * LAYERS * 2)


def test_a_compiled_llama_matches_eager_and_runs_packs(on_cpu, kernels, varlen, llama):
    """Under torch.compile transformers always adds its packed-sequence mask (it cannot look
    at position_ids while tracing): dashgen_mask takes it for the plain causal mask, and the
    position_ids decide when the graph runs."""
    torch._dynamo.reset()
    ids = torch.randint(0, 128, (2, 100))
    eager = llama(ids, use_cache=False).logits
    eager.float().sum().backward()
    eager_grads = [p.grad.clone() for p in llama.parameters()]
    llama.zero_grad(set_to_none=True)
    kernels.calls.clear()
    compiled = torch.compile(llama, backend="aot_eager")
    logits = compiled(ids, use_cache=False).logits
    logits.float().sum().backward()
    assert torch.equal(logits, eager)
    assert all(torch.equal(p.grad, g) for p, g in zip(llama.parameters(), eager_grads))
    # The custom ops ran (no eager prepared call), causal, once a layer each way.
    assert [name for name, _ in kernels.calls] == ["forward"] * LAYERS + ["backward"] * LAYERS
    assert all(options["causal"] for _, options in kernels.calls)
    packed = torch.cat([torch.arange(60), torch.arange(40)])[None]
    compiled(ids[:1], position_ids=packed, use_cache=False)
    assert len(varlen) == LAYERS and all(c["cu_q"] == [0, 60, 100] for c in varlen)
    torch._dynamo.reset()


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "gpt_oss"])
def test_windowed_models_run_each_layer_with_its_window_softcap_and_sinks(on_cpu, kernels,
                                                                         registered, family):
    """Gemma 2 (window 32 on alternate layers, logits capped at 50), Gemma 3 (window 32 on five
    of six layers) and GPT-OSS (window 32 on alternate layers, sinks): each layer reaches
    dashgen.attention with its own window (W - 1, 0) or none, Gemma 2's cap, GPT-OSS's sinks."""
    common = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64, vocab_size=128, sliding_window=32,
                  attn_implementation="dashgen")
    torch.manual_seed(0)
    if family == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            num_hidden_layers=2, attn_logit_softcapping=50.0, **common))
    elif family == "gemma3":
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            num_hidden_layers=6, **common))
    else:
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
            num_hidden_layers=2, num_local_experts=2, num_experts_per_tok=1,
            layer_types=["sliding_attention", "full_attention"], **common))
    model = model.to(BF16)
    ids = torch.randint(0, 128, (2, 100))
    logits = model(ids, use_cache=False).logits
    logits.float().sum().backward()
    calls = forwards(kernels)
    layers = model.model.layers
    assert len(calls) == len(layers)
    for layer, call in zip(layers, calls):
        window = layer.self_attn.sliding_window
        assert call.get("window") == (None if window is None else (window - 1, 0)), family
        assert call.get("softcap") == (50.0 if family == "gemma2" else None), family
    windowed = sum(layer.self_attn.sliding_window is not None for layer in layers)
    assert windowed == {"gemma2": 1, "gemma3": 5, "gpt_oss": 1}[family]
    if family == "gpt_oss":
        assert all(layer.self_attn.sinks.grad is not None for layer in layers)


def test_a_float32_qwen3_trains_under_autocast(on_cpu, kernels, registered):
    """Qwen3 with float32 weights under bf16 autocast: its q/k norms hand the attention float32
    q and k beside a bf16 v; each layer runs on dashgen in bf16, and the backward reaches the
    float32 weights."""
    config = transformers.Qwen3Config(hidden_size=128, intermediate_size=128,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                      num_hidden_layers=2, vocab_size=64,
                                      attn_implementation="dashgen")
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    ids = torch.randint(0, 64, (2, 40))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, use_cache=False).logits
    logits.float().sum().backward()
    assert len(forwards(kernels)) == 2
    assert {c[2] for c in kernels.forward_calls} == {torch.bfloat16}
    assert all(p.grad is not None and p.grad.dtype == torch.float32
               for p in model.model.layers[0].self_attn.q_proj.parameters())


def test_a_deepseek_v3_runs_mla_layers_with_v_narrower_than_q(on_cpu, kernels, registered):
    """DeepSeek-V3's MLA hands the attention q/k of 192 columns (128 + 64 rotary) and v of 128:
    each layer reaches dashgen.attention with them as they are, its backward prepared in V's
    width, and the output (128 a head) feeds o_proj."""
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        num_hidden_layers=LAYERS, hidden_size=256, intermediate_size=256,
        moe_intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None,
        kv_lora_rank=64, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        vocab_size=128, n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=LAYERS,
        n_group=1, topk_group=1, attn_implementation="dashgen")).to(BF16)
    ids = torch.randint(0, 128, (2, 100))
    logits = model(ids, use_cache=False).logits
    assert logits.shape == (2, 100, 128)
    assert forwards(kernels) == [dict(causal=True, softmax_scale=192 ** -0.5)] * LAYERS
    logits.float().sum().backward()
    assert [launch.selection.backward.kernel_name.split("_")[3] for launch in
            kernels.backward_launches] == ["d192v128"]  # one signature, both layers
    assert all(layer.self_attn.kv_b_proj.weight.grad.abs().sum() > 0
               for layer in model.model.layers)


def test_llama4s_chunked_layers_take_their_chunks(on_cpu, kernels, varlen, registered):
    """Llama 4 (attention_chunk_size 32, three chunked layers of four, as its config lays
    them): dashgen_mask takes the chunked causal mask, each chunked layer runs its chunks as a
    pack (chunk_pack: 32-key chunks of each row), the full layer dashgen.attention causal; with
    the chunked layers' attention computed per chunk, the logits are eager attention's."""
    config = transformers.Llama4TextConfig(
        num_hidden_layers=3, hidden_size=256, intermediate_size=256, intermediate_size_mlp=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
        num_local_experts=2, attention_chunk_size=32, attn_implementation="dashgen")
    assert config.layer_types == ["chunked_attention"] * 3
    torch.manual_seed(0)
    model = transformers.Llama4ForCausalLM(config).to(BF16)
    ids = torch.randint(0, 128, (2, 100))
    logits = model(ids, use_cache=False).logits
    chunks = [0, 32, 64, 96, 100, 132, 164, 196, 200]
    assert [(c["cu_q"], c["cu_k"], c["max_q"], c["causal"]) for c in varlen] == [
        (chunks, chunks, 32, True)] * 3
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    eager = model(ids, use_cache=False).logits
    apart = lambda a, b: (a.float() - b.float()).abs().max().item()  # noqa: E731
    assert apart(logits, eager) < 0.1  # bf16 rounding through three layers
    # Row 32 opens the second chunk: it sees only its own key, as row 0 does.
    assert apart(logits[:, 32], eager[:, 32]) == 0.0
    # The control: without chunks (the same weights) the rows past the first chunk move.
    model.config.layer_types = ["full_attention"] * 3
    unchunked = model(ids, use_cache=False).logits
    assert apart(unchunked[:, 32:], eager[:, 32:]) > 0.3
    assert apart(unchunked[:, :32], eager[:, :32]) < 0.1
    # A layer that is not chunked takes no chunk: the full layer of a four-layer model.
    four = SimpleNamespace(layer_types=["chunked_attention"] * 3 + ["full_attention"],
                           attention_chunk_size=32, _attn_implementation="dashgen")
    hf.dashgen_attention(attention_module(layer_idx=3, config=four), *bhsd_leaves(), None)
    assert forwards(kernels)[-1] == dict(causal=True, softmax_scale=1 / 8)


def test_llama4_with_packed_documents_is_refused_by_name(on_cpu, kernels, registered):
    """Llama 4's decoder layers do not hand position_ids to the attention, so documents packed
    by them cannot reach attention_varlen: the chunked layers' mask refuses the pack rather than
    chunk the row as one sequence."""
    config = transformers.Llama4TextConfig(
        num_hidden_layers=1, hidden_size=256, intermediate_size=256, intermediate_size_mlp=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
        num_local_experts=2, attention_chunk_size=32, attn_implementation="dashgen")
    model = transformers.Llama4ForCausalLM(config).to(BF16)
    packed = torch.cat([torch.arange(60), torch.arange(40)])[None]
    with pytest.raises(ValueError, match=r'^attn_implementation="dashgen": chunked attention over '
                                         r"documents packed by position_ids"):
        model(torch.randint(0, 128, (1, 100)), position_ids=packed, use_cache=False)
    assert kernels.calls == []


def test_packed_documents_the_attention_cannot_see_are_refused(on_cpu, kernels, registered):
    """A model whose decoder layers keep position_ids from the attention (Llama 4's, here
    without chunked layers): transformers' mask marks the documents packed, the attention gets
    no pack, and dashgen refuses rather than run the row as one sequence. The same model
    unpacked runs."""
    config = transformers.Llama4TextConfig(
        num_hidden_layers=1, hidden_size=256, intermediate_size=256, intermediate_size_mlp=256,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, vocab_size=128,
        num_local_experts=2, attention_chunk_size=None, attn_implementation="dashgen")
    assert config.layer_types == ["full_attention"]
    model = transformers.Llama4ForCausalLM(config).to(BF16)
    ids = torch.randint(0, 128, (1, 100))
    packed = torch.cat([torch.arange(60), torch.arange(40)])[None]
    with pytest.raises(ValueError, match=r'^attn_implementation="dashgen": position_ids pack '
                                         r"documents into this row"):
        model(ids, position_ids=packed, use_cache=False)
    assert kernels.calls == []
    model(ids, use_cache=False)
    assert forwards(kernels) == [dict(causal=True, softmax_scale=1 / 8)]


def test_a_head_dim_without_a_kernel_runs_padded(on_cpu, kernels):
    """A model whose head_dim has no dashgen kernel (72 here) runs zero-padded into the next
    served one (80), as under flash_attention_2, with 1/sqrt(72) as its scale; the output and
    the gradients come back at 72 columns."""
    q, k, v = bhsd_leaves(head_dim=72)
    out, _ = hf.dashgen_attention(attention_module(), q, k, v, None)
    assert out.shape == (2, 100, 8, 72)
    assert forwards(kernels) == [dict(causal=True, softmax_scale=72 ** -0.5)]
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape


def test_a_hybrid_models_packed_batch_with_seq_idx_runs_per_document(on_cpu, kernels, varlen,
                                                                      registered):
    """GraniteMoeHybrid's padding-free batches carry seq_idx beside the cu_seq_lens kwargs to
    every layer (its attention layers here): each layer runs the documents apart, and the
    logits are sdpa's over each document alone."""
    def granite(attn_implementation):
        torch.manual_seed(0)
        return transformers.GraniteMoeHybridForCausalLM(transformers.GraniteMoeHybridConfig(
            num_hidden_layers=LAYERS, hidden_size=256, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            layer_types=["full_attention"] * LAYERS, num_local_experts=2,
            num_experts_per_tok=1, mamba_n_heads=8, mamba_d_head=64,
            attn_implementation=attn_implementation)).to(BF16)

    ids = torch.randint(0, 128, (1, 100))
    cu = torch.tensor([0, 60, 100], dtype=torch.int32)
    pack = dict(position_ids=torch.cat([torch.arange(60), torch.arange(40)])[None],
                seq_idx=seq_idx_of(60, 40), cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=60,
                max_length_k=60)
    logits = granite("dashgen")(ids, **pack).logits
    assert kernels.calls == [] and [c["cu_q"] for c in varlen] == [[0, 60, 100]] * LAYERS
    reference = granite("sdpa")
    expected = torch.cat([reference(ids[:, :60]).logits, reference(ids[:, 60:]).logits], dim=1)
    err = (logits.double() - expected.double()).norm() / expected.double().norm()
    assert err < 2e-2
