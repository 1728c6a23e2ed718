#!/usr/bin/python3
"""The long-context suite (issue 29 point 1): RULER-style cases at ~1K, 2K, 4K and 8K
tokens, generated from a fixed seed, rendered with the model's own chat template and
measured with our tokenizer.

    python3 tools/longctx_suite.py --out build/longctx_suite.jsonl \\
        [--tokenize-binary build/bin/echokv-tokenize] [--chat-render-binary build/bin/echokv-chat-render] \\
        [--model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf] [--cases-per-cell 6] [--check-sha256]

Tasks (RULER, Hsieh et al. 2024, scored as RULER scores them):
  niah_single     one needle "One of the special magic numbers for KEY is: N." in real
                  English text; ask for KEY's number (contained match).
  niah_multikey   four needles of four keys (three distractors); ask for one key.
  niah_multivalue four numbers of one key; ask for all (RULER string_match_all: the share
                  of the answers contained).
  vt              variable tracking: VAR A = N, VAR B = VAR A, ... (4 hops); ask for every
                  variable holding N (string_match_all).
  two_hop         a two-hop chain "P keeps the key to the C door." / "Behind the C door is
                  a O." plus two distractor chains; ask what is behind P's door.
  cwe             common-word extraction: a numbered word list where 5 words appear 30
                  times (RULER's freq_cw; fewer below ~2K tokens: chars / 160, at least 3)
                  and the rest, drawn from 395 rare words, a few times; ask for the 5 most
                  common (string_match_all).
  qa              question answering over real long English text: the licence texts of
                  Debian's /usr/share/common-licenses, split in passages; the passage that
                  holds the answer among passages of the other documents (RULER's qa with
                  distractor documents; string_match_part: any answer contained).

The haystack is those licence texts (RULER's "essay" haystack is Paul Graham's essays;
these are the real long English texts every Debian system ships). A case's prompt is a
list of text segments whose concatenation is the rendered chat prompt
(system turn of the template, the user turn with instruction + context + question, the
generation prompt and RULER's answer prefix); segment 0 holds the template's head, the
instruction and the first quarter of the context (cut before a space), segments 1..3 the
other quarters
(the agent flow appends them one by one), the last segment the question, the template's
tail and the answer prefix. Every segment tokenizes on its own to the ids it has inside
the whole prompt (checked here: the evaluator can send segments as separate appends and
the session holds exactly the ids of the whole prompt). Token counts come from
echokv-tokenize on the GGUF; the chat template is the model's (echokv-chat-render with
tests/model/testdata/smollm2/chat_template.json, which equals the GGUF's).

Output: JSON lines, one case each, sorted by (length, task, index), bit-for-bit the same
for the same seed, texts and tokenizer (docs/results/longctx/suite.sha256 holds the
hash of the default suite; --check-sha256 compares).
"""

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SEED = 29
LENGTHS = (1024, 2048, 4096, 7936)  # the 8K cell stays under SmolLM2's 8,192 positions with the answer
LENGTH_NAMES = {1024: "1k", 2048: "2k", 4096: "4k", 7936: "8k"}
TASKS = ("niah_single", "niah_multikey", "niah_multivalue", "vt", "two_hop", "cwe", "qa")
SEGMENTS = 4  # context pieces (agent flow: one append each)
LICENSES = "/usr/share/common-licenses"
LICENSE_FILES = ("GPL-3", "GPL-2", "GPL-1", "LGPL-2.1", "LGPL-3", "GFDL-1.3", "Apache-2.0", "MPL-2.0",
                 "MPL-1.1", "Artistic", "CC0-1.0", "BSD")
TITLES = {
    "GPL-3": "GNU General Public License, version 3", "GPL-2": "GNU General Public License, version 2",
    "GPL-1": "GNU General Public License, version 1", "LGPL-2.1": "GNU Lesser General Public License, version 2.1",
    "LGPL-3": "GNU Lesser General Public License, version 3", "GFDL-1.3": "GNU Free Documentation License, version 1.3",
    "Apache-2.0": "Apache License, version 2.0", "MPL-2.0": "Mozilla Public License, version 2.0",
    "MPL-1.1": "Mozilla Public License, version 1.1", "Artistic": "The Artistic License",
    "CC0-1.0": "Creative Commons CC0 1.0 Universal", "BSD": "The BSD License",
}
# (document, question, answers, evidence the gold passage must contain verbatim).
QA = (
    ("GPL-3", "On what date was version 3 of the GNU General Public License published?",
     ["29 June 2007"], "Version 3, 29 June 2007"),
    ("Apache-2.0", "In which month and year was version 2.0 of the Apache License published?",
     ["January 2004"], "Version 2.0, January 2004"),
    ("GFDL-1.3", "On what date was version 1.3 of the GNU Free Documentation License published?",
     ["3 November 2008"], "Version 1.3, 3 November 2008"),
    ("LGPL-2.1", "In which month and year was version 2.1 of the GNU Lesser General Public License published?",
     ["February 1999"], "Version 2.1, February 1999"),
    ("GPL-3", "According to the GNU General Public License version 3, what is the preferred form of the work "
     "for making modifications to it called?", ["source code"], 'The "source code" for a work means'),
    ("MPL-2.0", "Which organization is the license steward of the Mozilla Public License?",
     ["Mozilla Foundation"], "Mozilla Foundation is the license steward"),
    ("GFDL-1.3", "In the GNU Free Documentation License, what is a copy that is not Transparent called?",
     ["Opaque"], 'A copy that is not "Transparent" is called "Opaque".'),
    ("CC0-1.0", "Which corporation says in CC0 1.0 Universal that it is not a law firm?",
     ["Creative Commons"], "CREATIVE COMMONS CORPORATION IS NOT A LAW FIRM"),
)
PEOPLE = ("Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiroshi", "Ingrid", "Jamal",
          "Katya", "Lorenzo", "Mina", "Nikolai", "Olga", "Pedro")
COLORS = ("red", "blue", "green", "yellow", "purple", "orange", "silver", "golden", "black", "white")
OBJECTS = ("piano", "bicycle", "telescope", "violin", "lantern", "globe", "typewriter", "compass",
           "clock", "kettle", "camera", "harp")
ANSWER_PREFIX = {
    "niah_single": "The special magic number for {key} mentioned in the provided text is",
    "niah_multikey": "The special magic number for {key} mentioned in the provided text is",
    "niah_multivalue": "The special magic numbers for {key} mentioned in the provided text are",
    "vt": "According to the chain of variable assignment in the text above, {n} variables are assigned the "
          "value {value}, they are:",
    "two_hop": "Behind the door whose key {person} keeps is a",
    "cwe": "Answer: The top 5 words that appear most often in the list are:",
    "qa": "Answer:",
}
MAX_TOKENS = {"niah_single": 16, "niah_multikey": 16, "niah_multivalue": 48, "vt": 32, "two_hop": 8,
              "cwe": 40, "qa": 16}
SCORING = {"niah_single": "contained_all", "niah_multikey": "contained_all", "niah_multivalue": "contained_all",
           "vt": "contained_all", "two_hop": "contained_all", "cwe": "contained_all", "qa": "contained_any"}


def score(prediction, answers, rule):
    """RULER's string_match_all (the share of answers contained, case-insensitive) and
    string_match_part (1 when any answer is contained)."""
    text = prediction.lower()
    hits = [1.0 if a.lower() in text else 0.0 for a in answers]
    if rule == "contained_all":
        return sum(hits) / len(hits)
    if rule == "contained_any":
        return max(hits)
    raise ValueError("unknown scoring rule %r" % rule)


def paragraphs(name):
    with open(os.path.join(LICENSES, name), encoding="utf-8") as f:
        raw = f.read()
    out = []
    for block in re.split(r"\n\s*\n", raw):
        text = " ".join(block.split())
        if len(text) >= 20:
            out.append(text)
    return out


def passages(name, limit=900):
    """Consecutive paragraphs of one document joined up to ~limit characters."""
    out, current = [], ""
    for p in paragraphs(name):
        if current and len(current) + len(p) > limit:
            out.append(current)
            current = ""
        current = (current + " " + p).strip()
    if current:
        out.append(current)
    return out


class Texts:
    def __init__(self):
        self.paragraphs = {name: paragraphs(name) for name in LICENSE_FILES}
        self.passages = {name: passages(name) for name in LICENSE_FILES}
        words = set()
        for ps in self.paragraphs.values():
            for p in ps:
                words.update(w for w in re.findall(r"[a-z]+", p) if 5 <= len(w) <= 10)
        self.words = sorted(words)


def haystack(rng, texts, chars):
    """Paragraphs of the licence texts, documents in a seeded order starting at a seeded
    paragraph, until `chars` characters."""
    order = list(LICENSE_FILES)
    rng.shuffle(order)
    stream = [p for name in order for p in texts.paragraphs[name]]
    start = rng.randrange(len(stream))
    out, total, i = [], 0, start
    while total < chars:
        p = stream[i % len(stream)]
        room = chars - total
        if len(p) > room:  # the last paragraph cut at a word boundary: fine length control
            p = p[:room].rsplit(" ", 1)[0]
            if len(p) < 20:
                break
        out.append(p)
        total += len(p) + 2
        i += 1
    return out


def insert(rng, paras, items, depths=None):
    """Inserts each item between paragraphs at a seeded (or given) depth in [0, 1]."""
    paras = list(paras)
    for k, item in enumerate(items):
        depth = depths[k] if depths is not None else rng.random()
        paras.insert(int(round(depth * len(paras))), item)
    return paras


def magic(rng):
    return str(rng.randrange(1000000, 10000000))


def build(task, rng, texts, chars):
    """(instruction, context paragraphs, question, answers, answer-prefix fields, meta)."""
    meta = {}
    if task.startswith("niah"):
        instruction = ("Some special magic numbers are hidden within the following text. Make sure to memorize "
                       "it. I will quiz you about the numbers afterwards.")
        keys = rng.sample(texts.words, 4)
        if task == "niah_single":
            values = [magic(rng)]
            needles = ["One of the special magic numbers for %s is: %s." % (keys[0], values[0])]
        elif task == "niah_multikey":
            values = [magic(rng) for _ in keys]
            needles = ["One of the special magic numbers for %s is: %s." % (k, v) for k, v in zip(keys, values)]
            values = values[:1]
        else:
            values = [magic(rng) for _ in range(4)]
            needles = ["One of the special magic numbers for %s is: %s." % (keys[0], v) for v in values]
        order = list(range(len(needles)))
        rng.shuffle(order)
        depths = [rng.random() for _ in needles]
        meta["depths"] = [round(d, 4) for d in depths]
        paras = insert(rng, haystack(rng, texts, chars), [needles[i] for i in order], depths)
        what = "numbers" if task == "niah_multivalue" else "number"
        question = "What are all the special magic %s for %s mentioned in the provided text?" % (what, keys[0]) \
            if task == "niah_multivalue" else \
            "What is the special magic number for %s mentioned in the provided text?" % keys[0]
        return instruction, paras, question, values, {"key": keys[0]}, meta
    if task == "vt":
        instruction = "Memorize and track the chain of variable assignment hidden in the following text."
        names = set()
        while len(names) < 5:
            names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
        names = sorted(names)
        rng.shuffle(names)
        value = str(rng.randrange(10000, 100000))
        chain = ["VAR %s = %s." % (names[0], value)] + \
                ["VAR %s = VAR %s." % (names[i], names[i - 1]) for i in range(1, len(names))]
        depths = sorted(rng.random() for _ in chain)
        meta["depths"] = [round(d, 4) for d in depths]
        paras = insert(rng, haystack(rng, texts, chars), [], None)
        for k, (item, depth) in enumerate(zip(chain, depths)):
            paras.insert(min(len(paras), int(round(depth * len(paras))) + k), item)
        question = "Find all variables that are assigned the value %s in the text above." % value
        return instruction, paras, question, names, {"n": len(names), "value": value}, meta
    if task == "two_hop":
        instruction = "Read the following text carefully; some sentences in it describe doors, keys and objects."
        people = rng.sample(PEOPLE, 3)
        colors = rng.sample(COLORS, 3)
        objects = rng.sample(OBJECTS, 3)
        facts = []
        for p, c, o in zip(people, colors, objects):
            facts.append("%s keeps the key to the %s door." % (p, c))
            facts.append("Behind the %s door is a %s." % (c, o))
        rng.shuffle(facts)
        depths = [rng.random() for _ in facts]
        meta["depths"] = [round(d, 4) for d in depths]
        paras = insert(rng, haystack(rng, texts, chars), facts, depths)
        question = "What is behind the door whose key %s keeps?" % people[0]
        return instruction, paras, question, [objects[0]], {"person": people[0]}, meta
    if task == "cwe":
        instruction = "Below is a numbered list of words. In these words, some appear more often than others. " \
                      "Memorize the ones that appear most often."
        pool = rng.sample(texts.words, 400)
        common, rare = pool[:5], pool[5:]
        # RULER's 30 copies of each common word from ~2K tokens up; fewer below, so the
        # list still holds rare words (at 1K, 30 copies alone fill the context).
        freq = max(3, min(30, chars // 160))
        words = [w for w in common for _ in range(freq)]
        while sum(len(w) + 7 for w in words) < chars:
            words.append(rng.choice(rare))
        rng.shuffle(words)
        paras = [" ".join("%d. %s" % (i + 1, w) for i, w in enumerate(words))]
        question = "What are the 5 most common words in the above list?"
        return instruction, paras, question, common, {}, meta
    if task == "qa":
        instruction = "Answer the question based on the given documents. Only give me the answer and do not " \
                      "output any other words. The following are given documents."
        doc, question, answers, evidence = QA[rng.randrange(len(QA))]
        gold = [p for p in texts.passages[doc] if evidence in p]
        assert gold, (doc, evidence)
        others = [(name, p) for name in LICENSE_FILES if name != doc and not name.startswith(doc.split("-")[0])
                  for p in texts.passages[name][1:]]
        rng.shuffle(others)
        picked, total = [], len(gold[0])
        for name, p in others:
            if total >= chars:
                break
            room = chars - total
            if len(p) > room:
                p = p[:room].rsplit(" ", 1)[0]
            picked.append((name, p))
            total += len(p) + 40
        at = rng.randrange(len(picked) + 1)
        picked.insert(at, (doc, gold[0]))
        meta["gold_document"] = doc
        meta["depths"] = [round(at / max(1, len(picked) - 1), 4)]
        paras = ["Document %d (%s): %s" % (i + 1, TITLES[name], p) for i, (name, p) in enumerate(picked)]
        return instruction, paras, question, answers, {}, meta
    raise ValueError(task)


def render_segments(head, tail, instruction, paras, question, prefix):
    """The segments: the context (paragraphs joined with blank lines) is cut in SEGMENTS
    pieces of about equal characters, each cut right before a space (the space starts
    the next piece, as the pre-tokenizer attaches it to the following word)."""
    context = "\n\n".join(paras)
    cuts = [0]
    for k in range(1, SEGMENTS):
        at = context.find(" ", max(cuts[-1] + 1, len(context) * k // SEGMENTS))
        cuts.append(at if at > 0 else len(context))
    cuts.append(len(context))
    pieces = [context[cuts[k]:cuts[k + 1]] for k in range(SEGMENTS)]
    segs = [head + instruction + "\n\n" + pieces[0]] + pieces[1:]
    segs.append("\n\n" + question + tail + prefix)
    return segs


class Tokenizer:
    """echokv-tokenize on many texts at once: one call, the texts separated by the
    special token <|endoftext|> (split before pre-tokenization, so each text is
    tokenized on its own)."""
    SEP = "<|endoftext|>"

    def __init__(self, binary, model):
        self.binary, self.model = binary, model
        out = self._run(self.SEP)
        assert len(out) == 1, out
        self.sep_id = out[0]

    def _run(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(text)
            path = f.name
        try:
            out = subprocess.run([self.binary, "--tokenizer", self.model, "--text-file", path, "--json"],
                                 check=True, capture_output=True, text=True).stdout
        finally:
            os.unlink(path)
        return json.loads(out)["ids"]

    def lengths(self, texts):
        for t in texts:
            assert self.SEP not in t
        ids = self._run(self.SEP.join(texts))
        counts, n = [], 0
        for i in ids:
            if i == self.sep_id:
                counts.append(n)
                n = 0
            else:
                n += 1
        counts.append(n)
        assert len(counts) == len(texts), (len(counts), len(texts))
        return counts

    def ids(self, text):
        return self._run(text)


def chat_wrapper(binary):
    """(head, tail) of one user message rendered with the model's chat template and the
    generation prompt, by echokv-chat-render (the template of the GGUF)."""
    with open(os.path.join(ROOT, "tests", "model", "testdata", "smollm2", "chat_template.json")) as f:
        template = json.load(f)["template"]
    marker = "\x01CONTENT\x01"
    with tempfile.TemporaryDirectory() as tmp:
        tpath, mpath = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "m.json")
        with open(tpath, "w") as f:
            f.write(template)
        with open(mpath, "w") as f:
            json.dump([{"role": "user", "content": marker}], f)
        out = subprocess.run([binary, "--template", tpath, "--messages", mpath, "--add-generation-prompt"],
                             check=True, capture_output=True, text=True).stdout
    head, tail = out.split(marker)
    return head, tail


def generate(args):
    texts = Texts()
    tok = Tokenizer(args.tokenize_binary, args.model)
    head, tail = chat_wrapper(args.chat_render_binary)
    cells = [(length, task, i) for length in args.lengths for task in args.tasks
             for i in range(args.cases_per_cell)]
    # Characters of context per cell: a first guess at 3.6 characters per token, then a
    # secant step on the measured length, bisection once the target is bracketed.
    chars_of = {c: int(3.6 * (c[0] - 150 - MAX_TOKENS[c[1]])) for c in cells}
    bounds = {c: [None, None] for c in cells}
    cases = {}
    for _round in range(16):
        todo = [c for c in cells if c not in cases]
        if not todo:
            break
        built = {}
        for c in todo:
            length, task, i = c
            rng = random.Random("%d:%s:%d:%d" % (args.seed, task, length, i))
            chars = chars_of[c]
            instruction, paras, question, answers, fields, meta = build(task, rng, texts, chars)
            prefix = ANSWER_PREFIX[task].format(**fields)
            segs = render_segments(head, tail, instruction, paras, question, prefix)
            built[c] = (segs, answers, meta, question, chars)
        flat = []
        for c in todo:
            segs = built[c][0]
            flat.append("".join(segs))
            flat.extend(segs)
        counts = tok.lengths(flat)
        at = 0
        for c in todo:
            segs, answers, meta, question, chars = built[c]
            whole, parts = counts[at], counts[at + 1:at + 1 + len(segs)]
            at += 1 + len(segs)
            length, task, i = c
            target = length - MAX_TOKENS[task]
            if os.environ.get("LONGCTX_DEBUG"):
                print(c, chars, whole, target, file=sys.stderr)
            # Within 5 % under the target; from round 10 on, 10 % (a cell whose length
            # moves in steps larger than the window, e.g. a cwe list item).
            if target * (0.95 if _round < 9 else 0.90) <= whole <= target:
                if sum(parts) != whole:
                    raise SystemExit("%s: segments tokenize to %d ids, the whole prompt to %d"
                                     % (c, sum(parts), whole))
                cases[c] = {
                    "id": "%s-%s-%02d" % (task, LENGTH_NAMES.get(length, str(length)), i),
                    "task": task, "length": length, "index": i, "n_tokens": whole,
                    "segment_tokens": parts, "question_tokens": parts[-1],
                    "context_tokens": whole - parts[-1], "answers": answers,
                    "scoring": SCORING[task], "max_tokens": MAX_TOKENS[task], "question": question,
                    "meta": meta, "segments": segs,
                }
            else:
                lo, hi = bounds[c]
                if whole > target:
                    bounds[c][1] = hi = chars if hi is None else min(hi, chars)
                else:
                    bounds[c][0] = lo = chars if lo is None else max(lo, chars)
                if lo is not None and hi is not None:
                    chars_of[c] = (lo + hi) // 2
                else:
                    chars_of[c] = int(chars * (target * 0.975 - 150) / max(1, whole - 150))
        print("round %d: %d of %d cases within their length" % (_round + 1, len(cases), len(cells)),
              file=sys.stderr)
    missing = [c for c in cells if c not in cases]
    if missing:
        raise SystemExit("no fit for %s" % missing[:5])
    # Prefix-consistency of the whole prompt, on a sample (the sum check above covers
    # the counts; this compares the ids themselves).
    sample = [cases[c] for c in cells[:: max(1, len(cells) // 8)]]
    for case in sample:
        whole = tok.ids("".join(case["segments"]))
        pieces = tok.ids(Tokenizer.SEP.join(case["segments"]))
        pieces = [i for i in pieces if i != tok.sep_id]
        if whole != pieces:
            raise SystemExit("%s: segment ids differ from the whole prompt's ids" % case["id"])
    return [cases[c] for c in cells]


def dumps(cases):
    return "".join(json.dumps(c, sort_keys=True, ensure_ascii=True) + "\n" for c in cases)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--tokenize-binary", default=os.path.join(ROOT, "build", "bin", "echokv-tokenize"))
    parser.add_argument("--chat-render-binary", default=os.path.join(ROOT, "build", "bin", "echokv-chat-render"))
    parser.add_argument("--model", default=os.path.join(os.environ.get("ECHOKV_MODELS") or
                                                        os.path.join(ROOT, ".cache", "models"),
                                                        "SmolLM2-135M-Instruct.Q4_1.gguf"))
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--cases-per-cell", type=int, default=6)
    parser.add_argument("--lengths", default=",".join(str(x) for x in LENGTHS))
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--check-sha256", action="store_true",
                        help="compare the output's hash with docs/results/longctx/suite.sha256")
    args = parser.parse_args()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.tasks = args.tasks.split(",")
    text = dumps(generate(args))
    with open(args.out, "w") as f:
        f.write(text)
    digest = hashlib.sha256(text.encode()).hexdigest()
    print("%s  %s (%d cases)" % (digest, args.out, text.count("\n")))
    if args.check_sha256:
        with open(os.path.join(ROOT, "docs", "results", "longctx", "suite.sha256")) as f:
            want = f.read().split()[0]
        if digest != want:
            print("sha256 differs from docs/results/longctx/suite.sha256 (%s)" % want, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
