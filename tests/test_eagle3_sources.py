"""Training prompts from real texts (eagle3/sources.py) and the free-form held-out set: deterministic, deduplicated,
disjoint from both evaluation sets, every source yields prompts; chats are accepted wherever prompts are."""
import random

import pytest

from eagle3 import load_target
from eagle3.prompts import evaluation_prompts, freeform_prompts, heldout_prompts
from eagle3.sources import (DOC_ROOT, LICENSE_ROOT, MAN_ROOT, TEXT_SOURCES, EvaluationText, Filter, Material, _key,
                            build_prompts, chat_prompts, make_request, strip_groff, text_of)
from tests.eagle3_helpers import decoder_for

ROOTS = {"docs": DOC_ROOT, "man": MAN_ROOT, "licenses": LICENSE_ROOT}


@pytest.fixture(scope="module")
def built():
    return build_prompts(TEXT_SOURCES, 24, seed=3)


@pytest.mark.parametrize("source", TEXT_SOURCES)
def test_each_source_yields_prompts(source):
    if source in ROOTS and not ROOTS[source].exists():
        pytest.skip(f"{ROOTS[source]} is not on this machine")
    rows, manifest = build_prompts([source], 5, seed=0)
    assert len(rows) == 5 and {r["source"] for r in rows} == {source}
    assert all(len(text_of(r["prompt"])) > 100 for r in rows)
    assert manifest["sources"] == {source: 5}


def test_prompts_are_deterministic_and_depend_on_the_seed(built):
    rows, _ = built
    again, _ = build_prompts(TEXT_SOURCES, 24, seed=3)
    other, _ = build_prompts(TEXT_SOURCES, 24, seed=4)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in again]
    assert {r["prompt"] for r in rows} != {r["prompt"] for r in other}


def test_manifest_counts_match_the_prompts(built):
    rows, manifest = built
    assert manifest["prompts"] == len(rows) == 24
    for field in ("source", "task"):
        counts = manifest[field + "s"]
        assert sum(counts.values()) == len(rows)
        assert all(counts[k] == sum(r[field] == k for r in rows) for k in counts)
    assert len(manifest["sources"]) == len(TEXT_SOURCES)  # split over all sources


def test_prompts_are_unique_and_disjoint_from_both_evaluation_sets(built):
    rows, _ = built
    assert len({_key(r["prompt"]) for r in rows}) == len(rows)
    evaluation = EvaluationText()
    assert not any(evaluation.overlaps(r["prompt"]) for r in rows)


def test_filter_drops_duplicates_evaluation_text_and_long_prompts():
    keep = Filter(fits=lambda p: len(p) < 2000)
    assert keep("Summarise: the quick brown fox jumps over the lazy dog near the river bank.")
    assert not keep("summarise -- The quick brown fox jumps over the lazy dog, near the river bank!")  # normalised
    evaluation_text = text_of(freeform_prompts()[10]["prompt"])
    wrapped = make_request(Material("prose", evaluation_text, "test"), random.Random(0))[1]
    assert not keep(wrapped)
    assert not keep(heldout_prompts()[0]["prompt"])  # a short one, inside a longer text
    assert not keep(f"Here is a question: {heldout_prompts()[1]['prompt']} Answer it.")
    assert not keep("x " * 1500)
    assert keep.dropped == dict(duplicate=1, duplicate_text=0, evaluation_overlap=3, too_long=1)


def test_requests_vary_their_wording_and_layout():
    m = Material("prose", ("A paragraph of plain text, long enough to be a real input for a request. " * 3).strip(), "t")
    rng = random.Random(0)
    prompts = [make_request(m, rng)[1] for _ in range(60)]
    assert len(set(prompts)) > 50
    assert any(p.startswith(m.text[:20]) for p in prompts) and any(p.endswith(m.text.strip()) for p in prompts)


def test_strip_groff():
    src = '.\\" a comment\n.TH TAR 1\n.SH NAME\ntar \\- an archiving utility\n.SH DESCRIPTION\n.B tar\nstores ' \
          '\\fIfiles\\fR in one \\fBarchive\\fR.\n.BR gzip (1)\nuse C:\\eTEMP \\(em or \\s-1not\\s0\n'
    text = strip_groff(src)
    assert "comment" not in text and "\\f" not in text and ".TH" not in text
    assert "tar - an archiving utility" in text and "stores files in one archive." in text and "gzip(1)" in text
    assert "use C:\\TEMP - or not" in text


def test_chats_continue_the_exchange():
    turns = [("What is a tarball?", "A tar archive, often compressed."),
             ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], "Hello!")]
    chats = chat_prompts(turns, 2, seed=0)
    assert chats == chat_prompts(turns, 2, seed=0) and len(chats) == 2
    for c in chats:
        assert [m["role"] for m in c[-3:]] == ["user", "assistant", "user"] and c[-1]["content"]
    assert any(c[0] == {"role": "system", "content": "Be brief."} and c[2]["content"] == "Hello!" for c in chats)


def test_freeform_set_is_free_form():
    rows = freeform_prompts()
    assert len(rows) >= 100 and len({r["id"] for r in rows}) == len(rows)
    assert len({r["style"] for r in rows}) >= 8
    chats = [r["prompt"] for r in rows if not isinstance(r["prompt"], str)]
    assert len(chats) >= 15 and all(c[-1]["role"] == "user" for c in chats)
    templated = {p["prompt"] for p in evaluation_prompts("template")}
    assert not templated & {r["prompt"] for r in rows if isinstance(r["prompt"], str)}


def test_decoder_takes_a_chat():
    target = load_target("tiny")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and now?"}]
    dec = decoder_for(target)
    out = dec.generate([chat, "plain prompt"], max_new_tokens=6, batch_size=2)
    ref = dec.generate_ids([target.encode_prompt(chat), target.encode_prompt("plain prompt")], max_new_tokens=6,
                           batch_size=2)
    assert [r.token_ids for r in out] == [r.token_ids for r in ref]
    assert target.encode_prompt(chat) != target.encode_prompt("and now?")
    with pytest.raises(ValueError):
        dec.generate([[{"role": "robot", "content": "x"}]])
