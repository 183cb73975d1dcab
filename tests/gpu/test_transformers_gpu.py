"""dashgen as a transformers attention implementation on an sm_90 GPU: a tiny Llama built with
attn_implementation="dashgen" gives the logits of the same weights under "sdpa" (to bf16
accuracy), and under torch.use_deterministic_algorithms(True) its parameter gradients are
bitwise equal from one backward to the next.

Run: PYTHONPATH=. python3 -m pytest tests/gpu/test_transformers_gpu.py -q
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dashgen.interfaces import transformers as hf  # noqa: E402
from dashgen.tools.bench import deterministic_algorithms  # noqa: E402

pytestmark = pytest.mark.gpu


def tiny_llama(attn_implementation: str, state_dict=None):
    config = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
        num_key_value_heads=2, head_dim=64, vocab_size=1000,
        attn_implementation=attn_implementation)
    model = transformers.LlamaForCausalLM(config)
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(device="cuda", dtype=torch.bfloat16)


def rel_err(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-6)).item()


def test_dashgen_llama_matches_sdpa_logits(seed):
    hf.register()
    ours = tiny_llama("dashgen").eval()
    theirs = tiny_llama("sdpa", ours.state_dict()).eval()
    assert ours.config._attn_implementation == "dashgen"
    assert theirs.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 1000, (2, 1024), device="cuda")
    with torch.no_grad():
        a = ours(ids, use_cache=False).logits
        b = theirs(ids, use_cache=False).logits
    assert torch.isfinite(a).all()
    assert rel_err(a, b) < 5e-2


def test_dashgen_llama_gradients_are_bitwise_reproducible(seed, monkeypatch):
    # cuBLAS refuses to run its matmuls under the deterministic flag without this setting.
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    hf.register()
    model = tiny_llama("dashgen").train()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda")
    # A fixed projection of the logits: cross-entropy's CUDA kernels are no part of the test.
    weight = torch.randn(2, 1024, 1000, device="cuda")

    def gradients():
        model.zero_grad(set_to_none=True)
        logits = model(ids, use_cache=False).logits
        (logits.float() * weight).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    with deterministic_algorithms(True):
        first = gradients()
        second = gradients()
    assert len(first) == len(second) > 0
    assert all(g.abs().sum() > 0 for g in first)  # every parameter gets a gradient
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_packed_documents_match_sdpa_and_keep_each_documents_bits(seed):
    """Padding-free packing (position_ids restarting per document, and the collator's
    cu_seq_lens kwargs): logits within bf16 accuracy of "sdpa" (which masks the pack), and a
    document's logits the bits it has when packed beside another document."""
    hf.register()
    ours = tiny_llama("dashgen").eval()
    theirs = tiny_llama("sdpa", ours.state_dict()).eval()
    lengths = [700, 1, 300, 23]
    ids = torch.randint(0, 1000, (1, sum(lengths)), device="cuda")
    positions = torch.cat([torch.arange(n, device="cuda") for n in lengths])[None]
    with torch.no_grad():
        a = ours(ids, position_ids=positions, use_cache=False).logits
        b = theirs(ids, position_ids=positions, use_cache=False).logits
        cu = torch.tensor([0, 700, 701, 1001, 1024], dtype=torch.int32, device="cuda")
        c = ours(ids, position_ids=positions, use_cache=False, cu_seq_lens_q=cu,
                 cu_seq_lens_k=cu, max_length_q=700, max_length_k=700).logits
        other = ids.clone()
        other[:, 701:] = (other[:, 701:] + 1) % 1000
        d = ours(other, position_ids=positions, use_cache=False).logits
    assert rel_err(a, b) < 5e-2
    assert torch.equal(a, c)
    assert torch.equal(a[:, :701], d[:, :701])


def tiny_windowed(family: str, attn_implementation: str, state_dict=None):
    """Small random models with sliding windows (128 keys) over sequences of 1,024 tokens:
    Mistral (every layer windowed), Gemma 2 (alternate layers, logits capped at 50), Gemma 3
    (five of six layers)."""
    common = dict(hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=64, vocab_size=1000, sliding_window=128,
                  attn_implementation=attn_implementation)
    if family == "mistral":
        model = transformers.MistralForCausalLM(transformers.MistralConfig(
            num_hidden_layers=2, **common))
    elif family == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            num_hidden_layers=2, attn_logit_softcapping=50.0, **common))
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            num_hidden_layers=6, **common))
    if state_dict is not None:
        model.load_state_dict(state_dict)
    return model.to(device="cuda", dtype=torch.bfloat16)


# The reference each family is held to: sdpa where it serves the model, else eager (softcap).
REFERENCE = {"mistral": "sdpa", "gemma2": "eager", "gemma3": "eager"}


@pytest.mark.parametrize("family", list(REFERENCE))
def test_windowed_models_match_their_reference_and_repeat_their_gradients(family, seed,
                                                                           monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    hf.register()
    ours = tiny_windowed(family, "dashgen").eval()
    theirs = tiny_windowed(family, REFERENCE[family], ours.state_dict()).eval()
    ids = torch.randint(0, 1000, (2, 1024), device="cuda")
    with torch.no_grad():
        a = ours(ids, use_cache=False).logits
        b = theirs(ids, use_cache=False).logits
    assert torch.isfinite(a).all() and rel_err(a, b) < 5e-2
    ours.train()
    weight = torch.randn(2, 1024, 1000, device="cuda")

    def gradients():
        ours.zero_grad(set_to_none=True)
        (ours(ids, use_cache=False).logits.float() * weight).sum().backward()
        return [p.grad.clone() for p in ours.parameters() if p.grad is not None]

    with deterministic_algorithms(True):
        first, second = gradients(), gradients()
    assert len(first) > 0 and all(torch.equal(x, y) for x, y in zip(first, second))


def test_a_float32_qwen3_under_autocast_matches_sdpa_and_repeats_its_gradients(seed,
                                                                              monkeypatch):
    """Qwen3 with float32 weights under bf16 autocast (its q/k norms hand the attention float32
    q and k): dashgen's logits within bf16 accuracy of sdpa's under the same autocast, and the
    float32 weights' gradients bitwise equal from one backward to the next."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    hf.register()

    def qwen3(attn_implementation, state_dict=None):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            num_hidden_layers=2, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
            num_key_value_heads=2, head_dim=128, vocab_size=1000,
            attn_implementation=attn_implementation))
        if state_dict is not None:
            model.load_state_dict(state_dict)
        return model.to("cuda")

    ours = qwen3("dashgen")
    theirs = qwen3("sdpa", ours.state_dict())
    ids = torch.randint(0, 1000, (2, 1024), device="cuda")
    weight = torch.randn(2, 1024, 1000, device="cuda")

    def run(model):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids, use_cache=False).logits
        (logits.float() * weight).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    with deterministic_algorithms(True):
        a, first = run(ours)
        _, second = run(ours)
    b, _ = run(theirs)
    assert rel_err(a, b) < 5e-2
    assert all(g.dtype == torch.float32 for g in first)
    assert all(torch.equal(x, y) for x, y in zip(first, second))


def test_padded_batches_match_sdpa_and_keep_each_rows_bits(seed, monkeypatch):
    """A batch padded on the left (row 0), on the right (row 1) and not at all (row 2): the
    logits at kept positions within bf16 accuracy of "sdpa" with the same mask; a row's logits
    the bits it has whatever the padding tokens and the other rows hold; the gradients bitwise
    equal from one backward to the next."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    hf.register()
    ours = tiny_llama("dashgen").eval()
    theirs = tiny_llama("sdpa", ours.state_dict()).eval()
    ids = torch.randint(1, 1000, (3, 1024), device="cuda")
    mask = torch.ones(3, 1024, dtype=torch.long, device="cuda")
    mask[0, :300] = 0
    mask[1, 1000:] = 0
    kept = mask.bool()
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, use_cache=False).logits
        b = theirs(ids, attention_mask=mask, use_cache=False).logits
        other = ids.masked_fill(~kept, 7)
        other[2] = (other[2] + 1) % 1000
        c = ours(other, attention_mask=mask, use_cache=False).logits
    assert torch.isfinite(a).all() and rel_err(a[kept], b[kept]) < 5e-2
    assert torch.equal(a[:2][kept[:2]], c[:2][kept[:2]])
    ours.train()
    weight = torch.randn(3, 1024, 1000, device="cuda") * mask[..., None]

    def gradients():
        ours.zero_grad(set_to_none=True)
        (ours(ids, attention_mask=mask, use_cache=False).logits.float() * weight).sum().backward()
        return [p.grad.clone() for p in ours.parameters()]

    with deterministic_algorithms(True):
        first, second = gradients(), gradients()
    assert all(torch.equal(x, y) for x, y in zip(first, second))
