"""bench/adaptation.py's workloads: one fixed instruction over many distinct real inputs, the same every run, so an
adaptation measurement can be repeated and its unseen items stay unseen."""
import pytest

from bench.adaptation import STYLES, style_prompts


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_style_is_one_instruction_over_distinct_inputs(style):
    prompts = style_prompts(style, 40)
    head = STYLES[style][2].split("{text}")[0]
    assert len(prompts) == 40 and len(set(prompts)) == 40
    assert all(p.startswith(head) and len(p) > len(head) + 20 for p in prompts)


def test_style_prompts_are_deterministic_and_depend_on_the_seed():
    assert style_prompts("explain-code", 30) == style_prompts("explain-code", 30)
    assert style_prompts("explain-code", 30, seed=1) != style_prompts("explain-code", 30)


def test_too_few_inputs_is_a_message_not_a_traceback():
    with pytest.raises(SystemExit, match="distinct inputs"):
        style_prompts("explain-code", 10 ** 7)
