"""Training prompts that are not templates: real texts found on this machine, turned into requests.

Sources (each reads files offline, in a seeded order, so the same seed gives the same prompts):
- stdlib:   Python standard-library source code (functions, classes) and docstrings, read with `ast`, never imported;
- docs:     package documentation under /usr/share/doc (README, NEWS, upstream changelogs, FAQ; .gz read as well);
- man:      manual pages under /usr/share/man/man1-8, groff markup stripped;
- licenses: licence texts (/usr/share/common-licenses, the copyright files under /usr/share/doc);
- chat:     multi-turn chats, the target's own answer followed by a follow-up turn (`chat_prompts`; eagle3.datagen
            builds them from answers it has generated, so they are not made here).

Each text becomes a summarise / rewrite / extract / classify / explain / translate / QA / continue request (code:
explain / review / document / test / translate / complexity / simplify / usage), phrased many ways, with the
instruction before the text, after it, or only a question after the text. Prompts are deduplicated on their
normalised text (and each text is used once), and any prompt that shares a run of OVERLAP_WORDS words with an
evaluation prompt of either held-out set, or contains a shorter one, is dropped: training never sees evaluation
text."""
import ast
import gzip
import hashlib
import itertools
import os
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .prompts import freeform_prompts, heldout_prompts

TEXT_SOURCES = ("stdlib", "docs", "man", "licenses")
ALL_SOURCES = TEXT_SOURCES + ("chat",)
MAX_CHARS = 3600      # a chunk's size cap: ~1,000 tokens of prose, leaving the rest of the context for the answer
MIN_CHARS = 120
OVERLAP_WORDS = 8     # a shared run this long with an evaluation prompt means the text is (nearly) the same
DOC_ROOT, MAN_ROOT, LICENSE_ROOT = Path("/usr/share/doc"), Path("/usr/share/man"), Path("/usr/share/common-licenses")


@dataclass
class Material:
    kind: str    # "code", "prose" or "manual"
    text: str
    origin: str  # where it came from (file, function), for the record


# ---------------------------------------------------------------- reading texts


def _read(path):
    """A text file, gzip or plain; None for binary or unreadable files."""
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def _paragraphs(text):
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


def _chunks(text, rng):
    """Consecutive paragraphs grouped into chunks of a size drawn per chunk (short, medium or long), capped at
    MAX_CHARS, so the set mixes one-paragraph inputs with long documents."""
    out, cur = [], []
    goal = _goal(rng)
    for p in _paragraphs(text):
        p = p[:MAX_CHARS].rsplit("\n", 1)[0] if len(p) > MAX_CHARS else p
        if cur and sum(map(len, cur)) + len(p) > MAX_CHARS:
            out.append("\n\n".join(cur))
            cur, goal = [], _goal(rng)
        cur.append(p)
        if sum(map(len, cur)) >= goal:
            out.append("\n\n".join(cur))
            cur, goal = [], _goal(rng)
    if cur:
        out.append("\n\n".join(cur))
    return [c for c in out if _is_text(c)]


def _goal(rng):
    return rng.choice([rng.randint(150, 500), rng.randint(500, 1500), rng.randint(1500, MAX_CHARS)])


def _is_text(chunk):
    """Long enough and mostly letters (drops tables of numbers, ASCII art and bare file lists)."""
    visible = [c for c in chunk if not c.isspace()]
    return len(chunk) >= MIN_CHARS and sum(c.isalpha() for c in visible) >= 0.6 * len(visible)


def _stdlib_files():
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__", "encodings"}  # encodings: 120 codec tables
    out = []
    for folder, dirs, files in os.walk(sysconfig.get_paths()["stdlib"]):
        dirs[:] = [d for d in dirs if d not in skip]  # pruned, not walked: site-packages can be huge
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(out)


def _stdlib_material(path, rng):
    """Functions and classes (their source) and docstrings of one module; order shuffled per file."""
    source = _read(path)
    try:
        tree = ast.parse(source or "")
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= 200:
        out.append(Material("prose", doc[:MAX_CHARS], f"{path.name} docstring"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # whole lines by number: ast.get_source_segment re-splits the file on every call (slow on big modules)
            code = "\n".join(lines[node.lineno - 1: node.end_lineno])
            if node.col_offset:  # a method: dedent by its own indentation
                code = "\n".join(line[node.col_offset:] for line in code.splitlines())
            if code and 80 <= len(code) <= 2800 and code.count("\n") >= 3:
                out.append(Material("code", code, f"{path.name}:{node.name}"))
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                out.append(Material("prose", doc[:MAX_CHARS], f"{path.name}:{node.name} docstring"))
    rng.shuffle(out)
    return out


_DOC_NAMES = re.compile(r"^(README|NEWS|CHANGES|changelog|FAQ|INTRO|TODO|HISTORY)([._-].*)?$", re.I)


def _doc_files():
    files = [p for p in sorted(DOC_ROOT.rglob("*")) if _DOC_NAMES.match(p.name) and "Debian" not in p.name]
    return [p for p in files if p.is_file() and p.stat().st_size < 2_000_000]


def _prose_material(kind):
    def material(path, rng):
        text = _read(path)
        return [Material(kind, c, str(path)) for c in _chunks(text, rng)] if text else []
    return material


def _license_files():
    copyrights = sorted(DOC_ROOT.glob("*/copyright"))
    return sorted(LICENSE_ROOT.glob("*")) + copyrights if LICENSE_ROOT.exists() else copyrights


def _man_files():
    return sorted(p for d in sorted(MAN_ROOT.glob("man[1-8]")) for p in d.iterdir() if p.is_file())


# groff escapes and what they become in plain text, applied in order
_ESCAPES = [(r"\\f(\[[^]]*\]|\(..|.)", ""),                                    # font changes: \fB \fR \f(CW \f[BI]
            (r"\\\((em|en)", "-"), (r"\\\((aq|cq)", "'"), (r"\\\((dq|lq|rq)", '"'), (r"\\\(bu", "*"),  # glyphs
            (r"\\-", "-"),                                                        # minus
            (r"\\s[-+]?\d", ""), (r"\\$", ""),                                   # point size, line continuation
            (r"\\[&|^%]", ""), (r"\\ ", " "),                                     # zero-width marks, fixed space
            (r"\\\*(\(..|\[[^]]*\]|.)", ""), (r"\\[^e]", ""),                    # string macros, anything else
            (r"\\e", lambda m: "\\")]                                           # a backslash, last: kept as is


def strip_groff(src):
    """Manual-page text from groff source: comments and layout requests dropped, font escapes removed, headings and
    tagged paragraphs kept as text. Good enough for prose, not a formatter."""
    out = []
    for line in src.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        m = re.match(r"^\.(\w+)\s*(.*)$", line)
        if m:
            req, args = m.groups()
            if req in ("SH", "SS"):
                line = "\n" + args.strip('"') + "\n"
            elif req in ("B", "I", "SM", "SB", "BR", "IR", "RB", "RI", "BI", "IB", "IP"):
                words = [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', args)]
                # .B/.I set their words in one font; .BR and kin alternate fonts with no space between
                line = " ".join(words) if req in ("B", "I", "SM", "SB") else words[0] if req == "IP" and words \
                    else "".join(words)
            elif req in ("PP", "P", "LP", "sp", "TP"):
                line = ""
            else:
                continue
        for pattern, repl in _ESCAPES:
            line = re.sub(pattern, repl, line)
        out.append(line)
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def _man_material(path, rng):
    src = _read(path)
    if not src or src.lstrip().startswith(".so "):  # .so: an alias page that only points at another page
        return []
    name = path.name.split(".")[0]
    return [Material("manual", c, f"man {name}") for c in _chunks(strip_groff(src), rng)]


def _stem(name):
    """The leading word of a page or package name: "gcloud_alpha_run.1.gz" -> "gcloud", "libperl5.36" -> "libperl"."""
    return re.match(r"[A-Za-z]*", name).group(0).lower()


def _doc_family(path):
    parts = path.relative_to(DOC_ROOT).parts if path.is_relative_to(DOC_ROOT) else (path.name,)
    return _stem(parts[0])


def _stdlib_family(path):
    return path.relative_to(sysconfig.get_paths()["stdlib"]).parts[0]


# source -> (its files, the texts of one file, the family of a file: files are interleaved by family, so that one
# family with thousands of pages (gcloud's man pages, say) cannot fill a source)
SOURCE_FILES = {"stdlib": (_stdlib_files, _stdlib_material, _stdlib_family),
                "docs": (_doc_files, _prose_material("prose"), _doc_family),
                "man": (_man_files, _man_material, lambda path: _stem(path.name)),
                "licenses": (_license_files, _prose_material("prose"), _doc_family)}


def interleave(files, family, rng):
    """Files in a seeded order that takes one file of each family in turn."""
    groups = {}
    for f in files:
        groups.setdefault(family(f), []).append(f)
    order = sorted(groups)
    rng.shuffle(order)
    for k in order:
        rng.shuffle(groups[k])
    return [f for row in itertools.zip_longest(*(groups[k] for k in order)) for f in row if f is not None]


# ---------------------------------------------------------------- requests, phrased many ways

LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch", "simple English", "plain English"]
CODE_LANGS = ["JavaScript", "Go", "Rust", "Java", "C", "TypeScript", "Ruby", "modern Python"]
NOUNS = {"prose": ["text", "passage", "paragraph", "excerpt", "document", "note"],
         "manual": ["manual page excerpt", "documentation", "man page section", "help text"],
         "code": ["code", "function", "snippet", "Python code"]}

PROSE_TASKS = {
    "summarise": ["Summarise this {noun}.", "Summarize the following {noun} in two sentences.",
                  "Give me a one-line summary of this {noun}.", "What's the gist of this?", "TL;DR please.",
                  "Write a short summary a busy reader could skim.", "Sum this up in three bullet points.",
                  "Condense this {noun} to about a third of its length.", "Can you boil this down for me?",
                  "Write an abstract for this {noun}."],
    "rewrite": ["Rewrite this {noun} in simpler words.", "Make this more formal.", "Rewrite this so a teenager gets it.",
                "Paraphrase this {noun} without changing its meaning.", "Turn this into a friendly email.",
                "Rewrite this as a numbered list of points.", "Make this shorter and clearer.",
                "Rewrite this {noun} in the active voice, and cut any filler."],
    "extract": ["List every name, date and number mentioned in this {noun}.", "Extract the key terms and define each.",
                "Pull out the main facts as a bulleted list.", "What are the action items or requirements here?",
                "Make a table of the things described in this {noun} and what each one does.",
                "Return the key points of this {noun} as JSON with the keys topic and points."],
    "classify": ["What kind of document is this? Answer in one word, then explain briefly.",
                 "Is this {noun} technical, legal, or general? Why?", "What topic is this {noun} about?",
                 "Is the tone of this {noun} formal or informal? Give one example from it.",
                 "Who is the intended audience of this {noun}?", "Tag this {noun} with three keywords."],
    "explain": ["Explain this {noun} to me like I'm new to the subject.", "What does this mean in plain terms?",
                "I don't understand this. Can you explain it step by step?", "Explain the hardest part of this.",
                "Why would someone write this {noun}? Explain its purpose."],
    "translate": ["Translate this into {lang}.", "Can you put this {noun} into {lang}?",
                  "How would this read in {lang}?"],
    "qa": ["What is the main point of this {noun}?", "What questions might a reader still have after this?",
           "Write three quiz questions about this {noun}, with answers.", "What would be a good title for this?",
           "Is anything in this {noun} unclear or contradictory?", "What is the most important sentence here, and why?"],
    "continue": ["Continue this {noun} with one more paragraph in the same style.", "What would come next? Write it.",
                 "Write the paragraph that should follow this one."],
}
MANUAL_TASKS = {
    "explain": ["What does this command do, in plain words?", "Explain this {noun} to a new Linux user.",
                "I'm reading this {noun}. What is it telling me?"],
    "usage": ["Based on this {noun}, give me three example commands with a comment each.",
              "How would I use the options described here? Show an example.",
              "Write a cheat sheet from this {noun}."],
}
CODE_TASKS = {
    "explain": ["What does this {noun} do?", "Explain this {noun} line by line.", "Walk me through this {noun}.",
                "Explain this to a beginner.", "What is the purpose of this {noun}, in two sentences?"],
    "review": ["Review this {noun}. Any bugs or risky parts?", "How could this {noun} be improved?",
               "Is there anything wrong with this {noun}?", "What edge cases does this {noun} miss?"],
    "document": ["Write a docstring for this {noun}.", "Add comments that explain why, not what.",
                 "Write short documentation for this {noun}, with one usage example."],
    "test": ["Write unit tests for this {noun} with pytest.", "What test cases would you write for this?"],
    "translate": ["Rewrite this {noun} in {code_lang}.", "How would this look in {code_lang}?"],
    "complexity": ["What is the big-O running time of this {noun}?", "Could this {noun} be slow on big inputs? Why?"],
    "simplify": ["Simplify this {noun} without changing its behaviour.", "Make this {noun} more readable."],
    "usage": ["Show me how to call this {noun}, with an example input and output.", "When would I use this?"],
}
TASKS = {"prose": PROSE_TASKS, "manual": {**PROSE_TASKS, **MANUAL_TASKS}, "code": CODE_TASKS}

PREFIXES = ["", "", "", "", "Hi! ", "Quick question. ", "Could you help me with this? ", "Please help. ",
            "I found this and I'm confused. ", "For my notes: "]
SUFFIXES = ["", "", "", "", " Thanks!", " Keep it short.", " Please be concise.", " Use bullet points if it helps.",
            " Answer in plain English.", " No more than 100 words."]


def _quote(text, kind, rng):
    if kind == "code":
        return rng.choice([f"```python\n{text}\n```", f"```\n{text}\n```", text])
    return rng.choice([text, text, f'"""\n{text}\n"""', f"---\n{text}\n---", f"Text:\n{text}"])


def make_request(m, rng):
    """One request about material `m`: (task, prompt). The layout varies: instruction first, instruction last, or
    the text followed by a question; wording, quoting, greeting and closing are drawn independently."""
    task = rng.choice(sorted(TASKS[m.kind]))
    instruction = rng.choice(TASKS[m.kind][task]).format(noun=rng.choice(NOUNS[m.kind]), lang=rng.choice(LANGS),
                                                         code_lang=rng.choice(CODE_LANGS))
    if rng.random() < 0.15:
        instruction = instruction[0].lower() + instruction[1:]
    instruction = rng.choice(PREFIXES) + instruction + rng.choice(SUFFIXES)
    body = _quote(m.text, m.kind, rng)
    layout = rng.random()
    if layout < 0.45:
        return task, f"{instruction}\n\n{body}"
    if layout < 0.85:
        return task, f"{body}\n\n{instruction}"
    noun = rng.choice(NOUNS[m.kind])
    return task, f"Here is a {noun}:\n\n{body}\n\n{instruction}"


# ---------------------------------------------------------------- multi-turn chats

FOLLOW_UPS = ["Can you make that shorter?", "Thanks. Can you give me an example?", "Explain that more simply, please.",
              "Why?", "Are you sure? Please double-check your answer.", "Can you put that in a table?",
              "Now turn it into a bulleted list.", "Translate your answer into {lang}.", "Say that in {n} words or fewer.",
              "What's the most important point in what you just said?", "Can you go into more detail on the first point?",
              "I didn't understand the last part. What did you mean?", "Give me a counter-argument.",
              "How would you explain this to a child?", "Write that as a short email to my team.",
              "What are the limitations of your answer?", "OK, and what should I do next?",
              "Can you add a concrete example from everyday life?", "Summarise our conversation so far in one sentence.",
              "Make it more formal.", "Make it sound friendlier.", "Give me three follow-up questions I could ask.",
              "That's helpful. What is a common mistake people make here?", "Can you rewrite that as a short poem?",
              "Now do the opposite: argue against it.", "Turn your answer into a checklist.",
              "What sources or terms should I look up to learn more?", "Could you rephrase that without jargon?",
              "Great, thanks! One more thing: how long would this take?", "hmm, that doesn't seem right to me. why?",
              "Shorter, please. Just the key idea.", "Can you number the steps?", "What would an expert add to this?"]


def chat_prompts(turns, n, seed):
    """n chats from (first user turn, the target's answer) pairs: the exchange followed by a follow-up request.
    A first turn that is itself a chat (a list of messages) is extended."""
    rng = random.Random(f"chat-{seed}")
    picks = rng.sample(range(len(turns)), min(n, len(turns)))
    out = []
    for i in picks:
        first, answer = turns[i]
        history = [{"role": "user", "content": first}] if isinstance(first, str) else list(first)
        follow = rng.choice(FOLLOW_UPS).format(lang=rng.choice(LANGS), n=rng.choice([20, 30, 50]))
        out.append(history + [{"role": "assistant", "content": answer}, {"role": "user", "content": follow}])
    return out


# ---------------------------------------------------------------- building the set


def normalise(text):
    return " ".join(re.sub(r"[^\w]+", " ", text.lower()).split())


def text_of(prompt):
    """All the text of a prompt or a chat."""
    return prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)


def _key(prompt):
    return hashlib.sha1(normalise(text_of(prompt)).encode()).hexdigest()


def _ngrams(text, n=OVERLAP_WORDS):
    words = normalise(text).split()
    return {" ".join(words[i: i + n]) for i in range(len(words) - n + 1)}


class EvaluationText:
    """Both held-out sets (template and free-form), to keep out of training: a prompt overlaps them when it shares
    a run of OVERLAP_WORDS words with one, or contains a shorter one whole."""

    def __init__(self):
        texts = [normalise(text_of(p["prompt"])) for p in heldout_prompts() + freeform_prompts()]
        self.grams = set().union(*(_ngrams(t) for t in texts))
        self.short = [t for t in texts if len(t.split()) < OVERLAP_WORDS]

    def overlaps(self, prompt):
        text = normalise(text_of(prompt))
        return bool(_ngrams(text) & self.grams) or any(f" {s} " in f" {text} " for s in self.short)


class Filter:
    """Keeps a prompt if it fits (a predicate on the prompt), is not a duplicate and shares no text with the
    evaluation sets; counts why the others were dropped (for the manifest)."""

    def __init__(self, fits=None, evaluation=None):
        self.fits = fits or (lambda prompt: len(text_of(prompt)) <= MAX_CHARS + 400)
        self.evaluation = evaluation or EvaluationText()
        self.seen, self.texts = set(), set()
        self.dropped = dict(duplicate=0, duplicate_text=0, evaluation_overlap=0, too_long=0)

    def new_text(self, text):
        """False for a text already used under another request (licence texts repeat across packages)."""
        key = _key(text)
        if key in self.texts:
            self.dropped["duplicate_text"] += 1
            return False
        self.texts.add(key)
        return True

    def __call__(self, prompt):
        key = _key(prompt)
        reason = ("duplicate" if key in self.seen else
                  "evaluation_overlap" if self.evaluation.overlaps(prompt) else
                  "too_long" if not self.fits(prompt) else None)
        if reason:
            self.dropped[reason] += 1
            return False
        self.seen.add(key)
        return True


def source_stream(source, seed, keep):
    """Prompts from one text source, one at a time. Files are visited in a seeded order, one text each per pass (so
    the set spreads over many files before it takes a second text from any); a text already used (by any source)
    is skipped; `keep` is a Filter."""
    rng = random.Random(f"{source}-{seed}")
    list_files, material, family = SOURCE_FILES[source]
    files = interleave(list_files(), family, rng)
    cache = {}
    for p in itertools.count():
        left = False
        for path in files:
            if path not in cache:
                cache[path] = material(path, random.Random(f"{source}-{seed}-{path}"))
            if p >= len(cache[path]):
                continue
            left = True
            m = cache[path][p]
            if keep.new_text(m.text):
                task, prompt = make_request(m, rng)
                if keep(prompt):
                    yield dict(source=source, task=task, origin=m.origin, prompt=prompt)
        if not left:
            return


def build_prompts(sources, n, seed=0, fits=None, evaluation=None):
    """n prompts taken in turn from the text `sources` (a source that runs out leaves the others to fill up), in a
    seeded order, and a manifest (counts per source and task, drops per reason). Deterministic given the seed and
    the files on disk."""
    keep = Filter(fits, evaluation)
    streams = [source_stream(s, seed, keep) for s in sources]
    rows = []
    while streams and len(rows) < n:
        for stream in list(streams):
            row = next(stream, None)
            if row is None:
                streams.remove(stream)
            elif len(rows) < n:
                rows.append(row)
    random.Random(f"order-{seed}").shuffle(rows)
    return rows, manifest(rows, keep.dropped)


def manifest(rows, dropped=None):
    count = lambda field: {k: sum(r[field] == k for r in rows) for k in sorted({r[field] for r in rows})}  # noqa: E731
    return dict(prompts=len(rows), sources=count("source"), tasks=count("task"), dropped=dropped or {})
