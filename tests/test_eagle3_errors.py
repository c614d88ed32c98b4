"""Bad input gives a ValueError that names the field."""
import pytest

from eagle3 import SpeculativeDecoder, load_target


@pytest.fixture(scope="module")
def dec():
    return SpeculativeDecoder(load_target("tiny"))


@pytest.mark.parametrize("kwargs,field", [
    (dict(parallel_degree=0), "parallel_degree"), (dict(parallel_degree=2.5), "parallel_degree"),
    (dict(validation_threshold=0), "validation_threshold"), (dict(validation_threshold=1.01), "validation_threshold"),
    (dict(validation_threshold=-0.5), "validation_threshold"), (dict(depth=0), "depth"),
    (dict(total_tokens=1), "total_tokens"), (dict(drafter="nope"), "drafter"),
])
def test_constructor_rejects(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeDecoder(load_target("tiny"), **kwargs)


@pytest.mark.parametrize("args,kwargs,field", [
    ([], {}, "prompts"), ([""], {}, r"prompts\[0\]"), (["ok", "  "], {}, r"prompts\[1\]"), ([3], {}, r"prompts\[0\]"),
    (["x" * 5000], {}, r"prompts\[0\].*context"), (["hi"], dict(max_new_tokens=0), "max_new_tokens"),
    (["hi"], dict(max_new_tokens=-3), "max_new_tokens"), (["hi"], dict(temperature=-1), "temperature"),
    (["hi"], dict(top_p=0), "top_p"), (["hi"], dict(top_p=1.5), "top_p"), (["hi"], dict(top_k=-1), "top_k"),
    (["hi"], dict(batch_size=0), "batch_size"),
])
def test_generate_rejects(dec, args, kwargs, field):
    with pytest.raises(ValueError, match=field):
        dec.generate(args, **kwargs)


def test_score_options_rejects(dec):
    with pytest.raises(ValueError, match="prompt"):
        dec.score_options("", ["a"])
    with pytest.raises(ValueError, match="options"):
        dec.score_options("hi", [])


def test_score_options_matches_full_forward(dec):
    """Branch scoring over the prompt cache equals scoring each prompt+option sequence on its own."""
    import torch

    t = dec.target
    scores = dec.score_options("Is this spam?", ["yes", "no", "maybe not"])
    p = t.encode_prompt("Is this spam?")
    for opt, s in zip(["yes", "no", "maybe not"], scores):
        seq = p + t.tokenizer.encode(opt)
        T = len(seq)
        lg, _ = t.model(torch.tensor([seq]), torch.arange(T)[None], t.model.new_cache(1, T),
                        torch.ones(T, T, dtype=torch.bool).tril()[None])
        lp = torch.log_softmax(lg[0].float(), -1)
        ref = sum(float(lp[len(p) - 1 + j, seq[len(p) + j]]) for j in range(T - len(p)))
        assert abs(ref - s) < 1e-6
