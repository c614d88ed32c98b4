"""Greedy speculative decoding is token-identical to vanilla greedy decoding of the same target."""

import pytest
import torch

from eagle3 import SpeculativeDecoder, attention, load_target, vnni
from eagle3.budget import PLAIN
from eagle3.profile import Profile
from eagle3_helpers import ScriptedBudget, decoder_for, pick_avx2_build, random_prompts, small_vocab_target

TREES = [dict(parallel_degree=1, depth=1, total_tokens=2), dict(parallel_degree=2, depth=3, total_tokens=6),
         dict(parallel_degree=4, depth=5, total_tokens=16), dict(parallel_degree=3, depth=6, total_tokens=30)]


@pytest.fixture(scope="module")
def target():
    return small_vocab_target()


@pytest.mark.parametrize("tree", TREES, ids=lambda t: "k{parallel_degree}-d{depth}-n{total_tokens}".format(**t))
def test_greedy_matches_vanilla_on_random_prompts(target, tree):
    dec = decoder_for(target, **tree)
    prompts = random_prompts(50, target.config.vocab_size)
    vanilla = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    assert dec.last_stats["accept_length"] == 1.0
    for batch in (1, 5):
        spec = dec.generate_ids(prompts, max_new_tokens=16, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
        if tree["depth"] > 1:
            # the untrained head guesses tokens of an 8-token vocabulary often: multi-token commits are exercised
            assert dec.last_stats["accept_length"] > 1.15
        assert dec.last_stats["target_forwards"] < sum(r.stats["target_forwards"] for r in vanilla) or tree["depth"] == 1


def speculation_matches_vanilla(target, batch, seed):
    """Greedy speculative decoding of 40 random prompts at `batch` with a 16-node tree gives vanilla's tokens, with
    multi-token rounds; returns the decoder."""
    dec = decoder_for(target, parallel_degree=4, depth=5, total_tokens=16)
    prompts = random_prompts(40, target.config.vocab_size, seed=seed)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=batch)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.15
    return dec


@pytest.mark.parametrize("kernel", ["own", "own, 1 digit", "torch"])
@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_matches_vanilla_in_bf16_with_int4(batch, kernel, monkeypatch):
    """The reduced-precision CPU path is lossless too: int4 layers give each row the same bits at any row count and
    attention is row-invariant (the fp32 kernel, or float64), so a token verified among tree nodes is the token a plain
    step would pick. kernel: the engine's own for this CPU where it has one (AMX, VNNI: eagle3/amx.py, eagle3/vnni.py),
    or torch's int4 kernel (what the others run); the VNNI kernel with two int8 digits per activation (its default) or
    one (EAGLE3_VNNI_DIGITS=1, llama.cpp's precision)."""
    from eagle3 import amx

    if kernel == "torch":
        monkeypatch.setattr(amx, "available", lambda: False)
        monkeypatch.setattr(vnni, "available", lambda: False)
    if kernel == "own, 1 digit":
        monkeypatch.setenv("EAGLE3_VNNI_DIGITS", "1")
    target = small_vocab_target(dtype=torch.bfloat16)
    down = target.model.layers[0].mlp.down_proj
    used = "amx" if down._amx is not None else "vnni" if down._vnni is not None else "torch"
    assert used == ("amx" if amx.available() else "vnni" if vnni.takes(down.weight) else "torch")  # AVX2: fp32 only
    assert used != "vnni" or down._vnni[2] == (1 if kernel == "own, 1 digit" else 2)
    speculation_matches_vanilla(target, batch, seed=3)


@pytest.mark.skipif(not vnni.available(), reason="this CPU has neither AVX512-VNNI nor AVX2")
@pytest.mark.parametrize("build", ["own", "avx2"])
@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_matches_vanilla_in_fp32_with_the_vnni_kernel(batch, build, monkeypatch):
    """CPUs without AVX512-BF16 run fp32 with the VNNI kernel's Q4_1 linears (its AVX2 build on CPUs with AVX2 alone):
    rows quantised on their own, integer sums, row-invariant attention, so lossless as the bf16 path."""
    if build == "avx2":
        pick_avx2_build(monkeypatch)
    target = small_vocab_target(dtype=torch.float32, int4=True)
    assert target.model.layers[0].mlp.down_proj._vnni[3] == vnni.kind()
    assert target.model.new_cache(1, 4).dtype == (torch.float32 if attention.available() else torch.float64)
    speculation_matches_vanilla(target, batch, seed=7)


@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_matches_vanilla_with_int8(batch):
    """The AVX2 path is lossless too: int8 linears quantise each activation row on its own and sum in integers, so
    a row gets the same bits at any row count; attention runs in the row-invariant fp32 kernel (or float64 where it
    does not build) so no rounding of an activation flips."""
    target = small_vocab_target(dtype=torch.float32, int8=True)
    assert target.model.layers[0].mlp.down_proj._int8 is not None and target.model.lm_head._int8 is not None
    assert target.model.new_cache(1, 4).dtype == (torch.float32 if attention.available() else torch.float64)
    dec = speculation_matches_vanilla(target, batch, seed=5)
    assert dec.head.fc._int8 is not None  # the head follows the target's weights


def test_full_tree_accepts_every_level(target):
    """With k = vocabulary size and every node kept, the tree holds every continuation: each round must accept
    both drafted levels plus the bonus token, exactly."""
    V = target.config.vocab_size
    dec = decoder_for(target, parallel_degree=V, depth=2, total_tokens=1 + V + V * V)
    prompts = random_prompts(10, V, seed=1)
    vanilla = dec.generate_ids(prompts, max_new_tokens=31, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=31, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] == 3.0
    assert all(r.stats["rounds"] == 10 for r in spec)  # 1 token from prefill + 10 rounds x 3


def test_switching_between_plain_steps_and_trees_stays_lossless(target):
    dec = decoder_for(target, adaptive=True, parallel_degree=4, depth=5, total_tokens=16)
    dec.budget = ScriptedBudget(dec.configured)
    dec.budget.profile = Profile("flat", [1], [1], [[1.0]])
    prompts = random_prompts(12, target.config.vocab_size, seed=2)
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=5)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert {PLAIN, 1, 5} <= set(dec.budget.shapes)
    assert dec.last_stats["plain_steps"] > 0 and dec.last_stats["accept_length"] > 1.1
    assert sum(dec.last_stats["accept_hist"]) < dec.last_stats["rounds"]  # the histogram counts tree rounds only


def test_default_adaptive_decoder_is_lossless(target):
    dec = decoder_for(target, adaptive=True)
    prompts = random_prompts(16, target.config.vocab_size, seed=4)
    vanilla = dec.generate_ids(prompts, max_new_tokens=32, speculative=False)
    for batch in (1, 8):
        spec = dec.generate_ids(prompts, max_new_tokens=32, batch_size=batch)
        assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.budget.calibration[True].seen.sum() > 0  # it verified drafts and measured their acceptance


def test_finished_rows_make_room_for_waiting_prompts(target):
    """Continuous batching: speculative rows finish at different rounds, and each freed row takes the next waiting
    prompt at once, so every round runs with batch_size rows until no prompt waits."""
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(12, target.config.vocab_size, seed=6)
    vanilla = dec.generate_ids(prompts, max_new_tokens=20, speculative=False)
    calls, forward = [], dec.model.forward
    def spy(tokens, positions, cache, tree_mask, logits_at=None):  # noqa: E306
        calls.append((tokens.shape[0], logits_at is not None))  # prefills of joining prompts pass logits_at
        return forward(tokens, positions, cache, tree_mask, logits_at)
    dec.model.forward = spy
    spec = dec.generate_ids(prompts, max_new_tokens=20, batch_size=4)
    del dec.model.forward
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    joins = [i for i, (_, prefill) in enumerate(calls) if prefill]
    assert sum(calls[i][0] for i in joins) == 12 and len(joins) > 3  # prompts joined a few at a time, not in 3 chunks
    assert all(rows == 4 for rows, prefill in calls[: joins[-1]] if not prefill)


def test_vanilla_batched_matches_unbatched(target):
    dec = decoder_for(target)
    prompts = random_prompts(20, target.config.vocab_size, seed=3)
    one = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=1)
    many = dec.generate_ids(prompts, max_new_tokens=16, speculative=False, batch_size=8)
    assert [r.token_ids for r in one] == [r.token_ids for r in many]


def test_stats_are_consistent(target):
    dec = decoder_for(target, parallel_degree=3, depth=4, total_tokens=10)
    res = dec.generate_ids(random_prompts(6, 8, seed=5), max_new_tokens=20, batch_size=3)
    for r in res:
        s = r.stats
        assert s["new_tokens"] == len(r.token_ids) == 20 and r.finish_reason == "length"
        assert s["target_forwards"] == s["rounds"] + 1  # prefill + one verify per round
        assert 1.0 <= s["accept_length"] <= 5.0
        assert s["tokens_per_s"] > 0
    tot = dec.last_stats
    assert tot["new_tokens"] == 120 and tot["draft_time_s"] > 0 and tot["verify_time_s"] > 0


def test_eos_stops_a_row(target):
    dec = decoder_for(target)
    prompts = random_prompts(8, 8, seed=9)
    ref = dec.generate_ids(prompts, max_new_tokens=20, speculative=False)
    eos = ref[0].token_ids[5]
    target.eos_ids = [eos]
    try:
        for spec in (False, True):
            out = dec.generate_ids(prompts, max_new_tokens=20, speculative=spec, batch_size=4)
            for r, full in zip(out, ref):
                cut = full.token_ids.index(eos) if eos in full.token_ids else None
                assert r.token_ids == full.token_ids[:cut]
                assert r.finish_reason == ("stop" if cut is not None else "length")
    finally:
        target.eos_ids = []


@pytest.mark.parametrize("weights", ["float32", "picked by hardware"])
def test_real_default_target_greedy_identical(weights):
    """The exact fp32 engine, and the weight format this machine's hardware picks (bf16 with the GGUF's int4 weights
    on CPUs with native bf16, int8 on the others: tests/test_eagle3_quant.py checks the choice). The tiny targets'
    tests run every format on every machine; the real target in an emulated format (bf16 on AVX2) costs minutes."""
    target = load_target(dtype="float32") if weights == "float32" else load_target()
    dec = SpeculativeDecoder(target)
    prompts = ["What is the capital of France?", "Write a haiku about autumn.", "List three prime numbers.",
               "Explain what a CPU does in one sentence."]
    vanilla = dec.generate(prompts, max_new_tokens=24, speculative=False, batch_size=1)
    spec = dec.generate(prompts, max_new_tokens=24, batch_size=4)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert "Paris" in vanilla[0].text


@pytest.mark.parametrize("speculative", [True, False])
def test_on_tokens_streams_each_prompts_output_in_order(target, speculative):
    """The streaming hook: per prompt (in the caller's order, whatever the batch order), the callback's tokens
    concatenate to the returned token_ids, arrive in several calls, and the output is unchanged by the hook."""
    dec = decoder_for(target, parallel_degree=2, depth=3, total_tokens=6)
    prompts = random_prompts(7, target.config.vocab_size, seed=3)
    plain = dec.generate_ids(prompts, max_new_tokens=16, batch_size=3, speculative=speculative)
    streamed, calls = [[] for _ in prompts], [0] * len(prompts)

    def on_tokens(i, tokens):
        assert tokens, "never an empty increment"
        streamed[i] += tokens
        calls[i] += 1

    hooked = dec.generate_ids(prompts, max_new_tokens=16, batch_size=3, speculative=speculative, on_tokens=on_tokens)
    assert [r.token_ids for r in hooked] == [r.token_ids for r in plain] == streamed
    assert all(n > 1 for n, r in zip(calls, plain) if len(r.token_ids) > 4)


def test_row_chunks_give_each_row_the_same_bits_at_any_row_count():
    """layers.row_chunks: dense GEMMs in calls of a fixed row count, so a row's result does not depend on how many
    rows share the forward or where it sits among them."""
    from eagle3.layers import Linear, row_chunks

    torch.manual_seed(0)
    lin = Linear(96, 80)
    lin.weight.data = torch.randn(80, 96, dtype=torch.bfloat16) * 0.1
    lin.chunkable = True
    lin.pack()
    x = torch.randn(70, 96, dtype=torch.bfloat16)
    with row_chunks(16):
        full = lin(x)
        for lo, hi in ((0, 1), (5, 6), (3, 20), (17, 70)):
            assert torch.equal(lin(x[lo:hi]), full[lo:hi]), (lo, hi)
    assert torch.allclose(full.float(), lin(x).float(), atol=0.05)  # the same product as without chunks


def test_greedy_matches_vanilla_in_row_chunk_mode(monkeypatch):
    """Calls with a batch size of hardware.ROW_CHUNK_FROM or more run the int4 layers dense, in row chunks:
    speculative output stays token-identical to vanilla in that mode too."""
    from eagle3 import amx, hardware
    from eagle3.layers import Linear

    monkeypatch.setattr(amx, "available", lambda: False)  # the int4 layers on torch's kernel, which row chunks bypass
    # bf16 int4 as on AMX CPUs; where oneDNN cannot pack bf16 (AVX2), fp32 dense layers take the same chunked path
    bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    target = small_vocab_target(dtype=torch.bfloat16 if bf16 else torch.float32)
    dec = decoder_for(target, parallel_degree=4, depth=5, total_tokens=16)
    dec.row_chunk = 8  # small, so verify forwards span many chunks
    calls = []
    chunked = Linear._chunked
    monkeypatch.setattr(Linear, "_chunked", lambda self, x, rows: calls.append(rows) or chunked(self, x, rows))
    prompts = random_prompts(40, target.config.vocab_size, seed=8)
    batch = hardware.ROW_CHUNK_FROM
    vanilla = dec.generate_ids(prompts, max_new_tokens=24, speculative=False, batch_size=batch)
    spec = dec.generate_ids(prompts, max_new_tokens=24, batch_size=batch)
    assert [r.token_ids for r in spec] == [r.token_ids for r in vanilla]
    assert dec.last_stats["accept_length"] > 1.15 and calls and set(calls) == {8}
