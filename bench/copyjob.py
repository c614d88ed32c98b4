"""A copy-heavy bulk job: items whose answers repeat their input — corrections, rewrites into lists, extractions and
review reports that quote the item — as bulk jobs often are. Built from the held-out topics (eagle3/prompts.py), so
no head was trained on them; deterministic given the seed."""
import random

from eagle3.prompts import HELDOUT_TOPICS

TEXTS = [
    "{T} has been studied for a long time. Researchers from many countries have written about it, and new "
    "findings appear every year. Some of them are surprising, and others confirm what was already known.",
    "Yesterday our class visited an exhibition about {t}. The guide explained how it works, showed us old "
    "photographs and answered every question. Afterwards we wrote a short report about what we had learned.",
    "The committee met on Monday to discuss {t}. After a long debate, the members agreed to publish a short "
    "guide, to organise two public talks and to review the budget again in the spring.",
    "Many people think {t} is simple, but the details are complicated. A good introduction starts with the "
    "history, then explains the main ideas, and finally gives a few examples from everyday life.",
]
TYPOS = [("the", "teh"), ("and", "adn"), ("about", "abuot"), ("every", "evrey"), ("which", "wich")]
COMMENTS = ["I loved the talk about {t}, the speaker was brilliant and very clear.",
            "This article about {t} is full of mistakes and the author clearly knows nothing.",
            "Buy cheap watches now!!! Best prices on {t} gadgets, click the link in my profile.",
            "Can anyone recommend a good book about {t} for a complete beginner?"]
TASKS = [
    "Correct the spelling in the following text and return the corrected text in full, without comments:\n\n{typo}",
    "Rewrite the following text as a bulleted list, one sentence per bullet, keeping the wording:\n\n{text}",
    "Copy the following text exactly, but replace the word \"{word}\" with \"{new}\" everywhere:\n\n{text}",
    "Extract the sentences of this text that mention {t}, word for word:\n\n{text}",
    "You are a content moderator. Quote the comment below in full, then give its label (ok, spam or abusive) "
    "and a one-sentence rationale.\n\nComment: {comment}",
    "Translate this text into simple English, keeping every sentence in the same order:\n\n{text}",
]


def _typos(text, rng):
    for right, wrong in rng.sample(TYPOS, 3):
        text = text.replace(f" {right} ", f" {wrong} ", 1)
    return text


def copy_prompts(n=64, seed=0):
    rng = random.Random(seed)
    topics = [t.strip() for t in HELDOUT_TOPICS.split(";") if t.strip()]
    out = []
    for i in range(n):
        t = rng.choice(topics)
        text = rng.choice(TEXTS).format(t=t, T=t[0].upper() + t[1:])
        word = rng.choice(["people", "short", "new", "long", "good"])
        fields = dict(t=t, text=text, typo=_typos(text, rng), word=word, new=word.upper(),
                      comment=rng.choice(COMMENTS).format(t=t))
        out.append(TASKS[i % len(TASKS)].format(**fields))
    return out
