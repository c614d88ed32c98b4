"""The target adapter computes what Hugging Face transformers computes, for the Llama, Qwen2 and Mistral layouts."""
import pytest
import torch

from eagle3.target import DEFAULT_TARGET, cache_dir, load_target
from eagle3_helpers import save_random_hf


@pytest.fixture(scope="module")
def default_target():
    return load_target()  # converts the embedded GGUF once, then loads from the cache


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_matches_transformers(kind, tmp_path, default_target):
    ref = save_random_hf(kind, tmp_path)
    t = load_target(str(tmp_path), device="cpu", dtype=torch.float32)  # the same dtype as the reference
    x = torch.randint(0, 49152, (2, 11))
    with torch.no_grad():
        out = ref(x, output_hidden_states=True)
    cache = t.model.new_cache(2, 16)
    mask = torch.ones(11, 11, dtype=torch.bool).tril().expand(2, 11, 11)
    logits, feats = t.model(x, torch.arange(11).expand(2, 11), cache, mask)
    assert torch.allclose(logits, out.logits, atol=1e-4, rtol=1e-4)
    expect = torch.cat([out.hidden_states[i] for i in (2, 3, 3)], -1)  # inputs of layers 2, n//2, n-3 for n=6
    assert torch.allclose(feats, expect, atol=1e-4)


def test_incremental_decode_matches_full_forward(default_target):
    """Cached one-token steps give the logits of one full forward (the KV cache and positions are right)."""
    m = default_target.model
    ids = default_target.encode_prompt("Name a colour.")
    T = len(ids)
    full, _ = m(torch.tensor([ids]), torch.arange(T)[None], m.new_cache(1, T),
                torch.ones(T, T, dtype=torch.bool).tril()[None])
    cache = m.new_cache(1, T)
    head = T - 3
    m(torch.tensor([ids[:head]]), torch.arange(head)[None], cache, torch.ones(head, head, dtype=torch.bool).tril()[None])
    cache.lens[:] = head
    for i in range(head, T):
        lg, _ = m(torch.tensor([[ids[i]]]), torch.tensor([[i]]), cache, torch.ones(1, 1, 1, dtype=torch.bool))
        cache.lens += 1
        assert torch.allclose(lg[0, 0], full[0, i], atol=1e-3)


def test_default_target_is_smollm2(default_target):
    c = default_target.config
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, c.num_key_value_heads) == (30, 576, 49152, 3)
    assert c.feature_layers == [2, 15, 27]
    assert (cache_dir() / DEFAULT_TARGET / "model.safetensors").exists()
    ids = default_target.encode_prompt("Hello")
    assert default_target.decode(ids).strip().endswith("assistant")  # the chat template is applied
    assert default_target.eos_ids == [2]  # <|im_end|>


def test_lm_head_gives_each_row_the_same_bits_at_any_row_count(default_target):
    """Whatever the probe chose (plain calls where the kernel is row-invariant, fixed 16-row calls where not), a
    token's logits do not depend on how many rows share the lm_head call: a plain step and a verify forward agree."""
    head = default_target.model.lm_head
    x = torch.randn(40, head.weight.shape[1], generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = head(x)
        assert all(torch.equal(head(x[:n].clone()), full[:n]) for n in (1, 2, 3, 7, 16, 23))


def test_row_invariance_probe_catches_a_kernel_that_depends_on_the_row_count():
    from eagle3.layers import Linear

    class Drifting(Linear):  # rounds a lone row differently, as oneDNN's 1-row kernel does on AMX CPUs
        def forward(self, x):
            y = super().forward(x)
            return y + 1e-3 if x.reshape(-1, x.shape[-1]).shape[0] == 1 else y

    lin, drifting = Linear(8, 4), Drifting(8, 4)
    for m in (lin, drifting):
        torch.nn.init.normal_(m.weight)
        m.pack()  # as the target's linears are
    assert lin.row_invariant() and not drifting.row_invariant()
