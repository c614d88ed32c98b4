"""Compiled decode steps (eagle3/compiled.py): the same losslessness as eager steps, and the switch that picks them."""
import pytest
import torch

from eagle3 import SpeculativeDecoder, compiled, load_target
from eagle3.profile import Profile
from eagle3_helpers import ScriptedBudget, decoder_for, random_prompts, small_vocab_target


@pytest.fixture(scope="module")
def int4_target():
    return small_vocab_target(dtype=torch.bfloat16)  # int4 layers: compiled steps are on for it


def _forward(model, cache, toks, start):
    T = toks.shape[1]
    pos = start + torch.arange(T)[None]
    return model(toks, pos, cache, torch.ones(T, T, dtype=torch.bool).tril()[None])[0][0]


def test_a_row_gets_the_same_bits_in_every_bucket(int4_target):
    """One token per forward (bucket 1) and chains of 3, 6, 12 and 20 (padded to buckets 4, 8, 16 and 32) give each
    token the same logits, bit for bit: the condition for a verify forward to accept exactly what plain steps emit.
    Trees past the buckets warm_up compiles (a hybrid drafter's grafted tree, a configured total_tokens of 24) run
    compiled too: an eager forward's bits differ (eagle3/compiled.py)."""
    model = int4_target.model
    prompt = torch.randint(0, 8, (1, 20), generator=torch.Generator().manual_seed(0))
    toks = torch.randint(0, 8, (1, 20), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache(1, 64)
    with torch.no_grad(), compiled.compiled_steps():
        model(prompt, torch.arange(20)[None], cache, torch.ones(20, 20, dtype=torch.bool).tril()[None])
        cache.lens[:] = 20
        steps = []
        for j in range(20):
            steps.append(_forward(model, cache, toks[:, j: j + 1], int(cache.lens))[0])
            cache.lens += 1
        cache.lens[:] = 20
        for T, bucket in ((3, 4), (6, 8), (12, 16), (20, 32)):
            assert compiled.steps((1, T)).tokens == bucket
            assert torch.equal(_forward(model, cache, toks[:, :T], 20), torch.stack(steps[:T])), T


@pytest.fixture
def cpp_wrapper(monkeypatch):
    """From here to the test's end compiled steps run inductor's C++ wrapper, the engine's default on CPUs (conftest
    turns it off for the other tests)."""
    monkeypatch.setenv("EAGLE3_CPP_WRAPPER", "1")
    for f in (compiled._layers, compiled._head):
        f.cache_clear()
    yield
    for f in (compiled._layers, compiled._head):
        f.cache_clear()


def _fp32_kernel_target():
    """The tiny target as CPUs without AVX512-BF16 run it: fp32, the VNNI kernel (or its AVX2 build), fp32 attention."""
    from eagle3 import vnni

    return small_vocab_target(dtype=torch.float32, int4=True) if vnni.available() else None


def test_the_cpp_wrapper_gives_the_python_wrappers_bits_and_stays_lossless(int4_target, cpp_wrapper, monkeypatch):
    """The C++ wrapper runs the same kernels: each bucket's logits have the Python wrapper's bits, and speculation
    in its steps emits vanilla's tokens. On the target as this CPU runs it without bf16 (fp32 with the VNNI kernel or
    its AVX2 build) where a build runs, else int4 in bf16 (one of them: each costs a minute of compiling)."""
    target = _fp32_kernel_target() or int4_target
    assert compiled._options()["cpp_wrapper"] == (not torch.cuda.is_available())
    model, g = target.model, torch.Generator().manual_seed(3)
    prompt, toks = torch.randint(0, 8, (1, 12), generator=g), torch.randint(0, 8, (1, 5), generator=g)

    def logits(T):
        cache = model.new_cache(1, 32)
        with torch.no_grad(), compiled.compiled_steps():
            model(prompt, torch.arange(12)[None], cache, torch.ones(12, 12, dtype=torch.bool).tril()[None])
            cache.lens[:] = 12
            return _forward(model, cache, toks[:, :T], 12)

    cpp = {T: logits(T) for T in (1, 5)}
    monkeypatch.setenv("EAGLE3_CPP_WRAPPER", "0")
    compiled._layers.cache_clear()
    assert all(torch.equal(logits(T), cpp[T]) for T in (1, 5))
    monkeypatch.setenv("EAGLE3_CPP_WRAPPER", "1")
    compiled._layers.cache_clear()
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(6, 8, seed=4)
    vanilla = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=3)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla] and dec.last_stats["accept_length"] > 1.1


def test_padding_leaves_the_real_tokens_alone():
    """pad(): extra tokens see only themselves and come after the real ones, so the real tokens' logits are those of
    the unpadded forward (float64 target, eager: exact to rounding)."""
    model = small_vocab_target().model
    toks, T = torch.tensor([[1, 5, 2, 7, 3]]), 5
    pos = torch.arange(T)[None]
    tree = torch.tensor([[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 1, 0, 1]]],
                        dtype=torch.bool)
    ref = model(toks, pos, model.new_cache(1, 16), tree)[0]
    padded = compiled.pad(toks, pos, tree, 8)
    assert padded[0].shape == (1, 8) and padded[2][0, 5:, :5].sum() == 0 and padded[2][0, :5, 5:].sum() == 0
    out = model(*padded[:2], model.new_cache(1, 16), padded[2])[0]
    assert torch.allclose(out[:, :T], ref, atol=1e-12)


def test_a_row_gets_the_same_bits_at_any_batch_size(int4_target):
    """Batch 1 has its own graphs and 2+ rows share dynamic-batch ones: a row's logits are the same bits in both."""
    model = int4_target.model
    g = torch.Generator().manual_seed(2)
    prompts, toks = torch.randint(0, 8, (3, 16), generator=g), torch.randint(0, 8, (3, 4), generator=g)
    out = {}
    with torch.no_grad(), compiled.compiled_steps():
        for B in (1, 2, 3):
            cache = model.new_cache(B, 32)
            model(prompts[:B], torch.arange(16).expand(B, 16), cache,
                  torch.ones(16, 16, dtype=torch.bool).tril().expand(B, 16, 16))
            cache.lens[:] = 16
            out[B] = model(toks[:B], (16 + torch.arange(4)).expand(B, 4), cache,
                           torch.ones(4, 4, dtype=torch.bool).tril().expand(B, 4, 4))[0]
    assert torch.equal(out[1][0], out[3][0]) and torch.equal(out[2], out[3][:2])


@pytest.mark.parametrize("drafter", ["eagle", "suffix"])
@pytest.mark.parametrize("batch", [1, 3])
def test_speculation_in_compiled_steps_matches_vanilla(int4_target, drafter, batch, monkeypatch):
    """Speculative calls and vanilla ones run compiled steps (the budget switches between plain steps and trees
    trimmed to every size, so every bucket and its padding are used) and emit the same tokens, at any batch size."""
    used = []
    real = compiled.steps
    monkeypatch.setattr(compiled, "steps", lambda shape: used.append(real(shape).tokens) or real(shape))
    dec = decoder_for(int4_target, adaptive=True, parallel_degree=4, depth=5, total_tokens=16, drafter=drafter)
    dec.budget = ScriptedBudget(dec.configured)
    dec.budget.profile = Profile("flat", [1], [1], [[1.0]])
    prompts = random_prompts(12, 8, seed=5)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    assert set(used) >= {1}
    used.clear()
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=batch)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.15 and len({b for b in used if b}) >= 2


def test_compiled_steps_are_chosen_per_call_and_can_be_switched_off(int4_target, monkeypatch):
    assert compiled.available(int4_target.model)
    assert not compiled.available(small_vocab_target().model)  # fp64 on a CPU: no int4, the eager path
    int8 = small_vocab_target(dtype=torch.float32, int8=True).model  # compiled only with AVX2 code (compiled.py)
    assert compiled.available(int8) == (torch.backends.cpu.get_cpu_capability() in ("DEFAULT", "AVX2"))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert compiled.available(int8)
    monkeypatch.setenv("EAGLE3_COMPILE", "0")
    assert not compiled.available(int4_target.model)
    assert compiled.steps((1, 1)) is compiled.EAGER  # outside compiled_steps()
    with compiled.compiled_steps():
        assert compiled.steps((1, 17)).tokens == 32  # past the buckets warm_up compiles: compiled all the same
        assert compiled.steps((1, 5)).tokens == 8


def test_prefills_stay_eager(int4_target, monkeypatch):
    """A prompt's forward (logits_at given) never runs compiled: its bits must not depend on the prompts it was
    padded with."""
    used = []
    monkeypatch.setattr(compiled, "steps", lambda shape: used.append(shape) or compiled.EAGER)
    model = int4_target.model
    with compiled.compiled_steps():
        model(torch.tensor([[1, 2, 3]]), torch.arange(3)[None], model.new_cache(1, 8),
              torch.ones(3, 3, dtype=torch.bool).tril()[None], logits_at=torch.tensor([[2]]))
        assert used == []
        model(torch.tensor([[1]]), torch.tensor([[0]]), model.new_cache(1, 8), torch.ones(1, 1, 1, dtype=torch.bool))
        assert used == [(1, 1)]


def test_default_target_is_lossless_in_compiled_steps():
    target = load_target()
    dec = SpeculativeDecoder(target, adaptive=False, total_tokens=6, depth=4)
    dec.compiled = True  # as on a CPU with bf16 (int4 layers); an fp32 engine's compiled linears are plain GEMMs
    prompts = ["Name three colours.", "What is the capital of France? Answer in one sentence."]
    vanilla = dec.generate(prompts, 32, batch_size=1, speculative=False)
    for batch in (1, 2):
        spec = dec.generate(prompts, 32, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.3


def test_warm_up_compiles_every_tree_size_ahead(int4_target, monkeypatch):
    """After warm_up(batch), decoding at that batch size (and at batch 1) with trees of every bucket's size
    compiles no new graph: no call pays for a compile in the middle of its decode. With the engine's default kernel
    choice: on AMX CPUs batch-1 calls run the VNNI kernel and the batch's last rows the AMX one, each its own graphs
    (a batch-8 call's stragglers once compiled theirs mid-call: one of three repetitions ran at 60 tok/s, not 300)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("EAGLE3_FEW_ROWS", "1")  # the engine's default (conftest turns it off for other tests)
    decs = [decoder_for(int4_target, parallel_degree=2, depth=4, total_tokens=n) for n in (2, 3, 4, 8, 16)]
    decs[0].warm_up(3)
    graphs = counters["stats"]["unique_graphs"]
    prompts = random_prompts(4, 8, seed=9)
    for dec in decs:
        for batch in (1, 3):
            dec.generate_ids(prompts, max_new_tokens=6, batch_size=batch)
            dec.generate_ids(prompts, max_new_tokens=6, batch_size=batch, speculative=False)
    assert counters["stats"]["unique_graphs"] == graphs


def _head_inputs(head, lens, T, seed=0):
    """A head cache of 3 rows with committed pairs up to `lens` (random K/V), and T random new inputs per row."""
    g = torch.Generator().manual_seed(seed)
    h, dt = head.config.hidden_size, head.fc.weight.dtype
    cache = head.new_cache(len(lens), 32)
    cache.k.normal_(generator=g)
    cache.v.normal_(generator=g)
    cache.lens[:] = torch.tensor(lens)
    emb, hidden = (torch.randn(len(lens), T, h, generator=g).to(dt) for _ in range(2))
    return cache, emb, hidden, cache.lens[:, None] + torch.arange(T)


def _relative_error(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def test_a_head_step_sees_only_its_own_rows_context(int4_target):
    """The head step reads the cache's first max(lens) + offset slots: a row whose context is shorter than its
    neighbours' gets (to float tolerance) what it gets alone, drafting's earlier slots included."""
    head = decoder_for(int4_target).head
    cache, emb, hidden, pos = _head_inputs(head, [3, 9, 5], 2)
    mask = torch.tensor([[[1, 0, 1, 0], [0, 1, 0, 1]]], dtype=torch.bool).expand(3, 2, 4)  # 2 earlier draft slots
    with torch.no_grad():
        together = head(emb, hidden, pos + 2, cache, mask, offset=2)
        for b in range(3):
            alone = head.new_cache(1, 32)
            alone.k[:, 0], alone.v[:, 0], alone.lens[:] = cache.k[:, b], cache.v[:, b], cache.lens[b]
            out = head(emb[b:b + 1], hidden[b:b + 1], pos[b:b + 1] + 2, alone, mask[b:b + 1], offset=2)
            assert _relative_error(out, together[b:b + 1]) < 0.02, b


def test_a_compiled_head_step_matches_the_eager_one(int4_target):
    """Within compiled_steps the head's step runs as a compiled graph: its output and the K/V it writes agree with
    the eager step's to float tolerance (drafts only propose, so bits may differ), whatever the batch, new tokens
    and context length."""
    head = decoder_for(int4_target).head
    for lens, T in (([3, 9, 5], 2), ([0, 0, 0], 5), ([7, 1, 2], 1)):
        eager_cache, emb, hidden, pos = _head_inputs(head, lens, T)
        compiled_cache = _head_inputs(head, lens, T)[0]
        mask = torch.ones(T, T, dtype=torch.bool).tril().expand(3, T, T)
        with torch.no_grad():
            eager = head(emb, hidden, pos, eager_cache, mask)
            with compiled.compiled_steps(True):
                fast = head(emb, hidden, pos, compiled_cache, mask)
        for a, b in ((fast, eager), (compiled_cache.k, eager_cache.k), (compiled_cache.v, eager_cache.v)):
            assert _relative_error(a, b) < 0.02  # a few bf16 roundings: fused ops round at other places


def test_calls_of_few_rows_run_the_vnni_kernel_where_both_run(int4_target, monkeypatch):
    """On AMX CPUs the Linears hold the VNNI kernel's packing too, and batch-1 calls run it (hardware.few_rows_until):
    eager and compiled forwards switch kernels with layers.few_rows (each kernel its own graphs: a graph traced for
    one must never serve the other), prefills keep the AMX kernel, and speculation stays lossless in both modes."""
    from eagle3 import amx, hardware, layers, vnni

    monkeypatch.setenv("EAGLE3_FEW_ROWS", "1")  # the engine's default (conftest turns it off for other tests)
    model = int4_target.model
    if not layers.has_both_kernels(model):
        assert not (amx.available() and vnni.kind() == "vnni") and hardware.few_rows_until(model) == 0
        pytest.skip("this CPU runs at most one of the engine's int4 kernels")
    assert hardware.few_rows_until(model) == 1
    down = model.layers[0].mlp.down_proj
    x = torch.randn(3, down.weight.shape[1]).to(torch.bfloat16)
    with torch.no_grad():
        with layers.few_rows():
            assert torch.equal(down(x), vnni.mm(x, *down._vnni))
        assert torch.equal(down(x), amx.mm(x, *down._amx))
    assert not torch.equal(vnni.mm(x, *down._vnni), amx.mm(x, *down._amx))

    prompt, tok = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[5]])
    out = []
    for few in (True, False, True, False):
        cache = model.new_cache(1, 8)
        with torch.no_grad(), layers.few_rows(few), compiled.compiled_steps():
            first = model(prompt, torch.arange(4)[None], cache, torch.ones(4, 4, dtype=torch.bool).tril()[None],
                          logits_at=torch.tensor([[3]]))[0]
            cache.lens[:] = 4
            out.append((first, _forward(model, cache, tok, 4)))
    assert torch.equal(out[0][0], out[1][0])  # the prefill: the AMX kernel either way
    assert torch.equal(out[0][1], out[2][1]) and torch.equal(out[1][1], out[3][1])
    assert not torch.equal(out[0][1], out[1][1])

    dec = decoder_for(int4_target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(6, 8, seed=11)
    for batch in (1, 2):  # the VNNI kernel, then the AMX one
        vanilla = dec.generate_ids(prompts, max_new_tokens=16, batch_size=batch, speculative=False)
        spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
