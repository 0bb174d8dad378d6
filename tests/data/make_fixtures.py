#!/usr/bin/env python3
"""Writes the tokenizer fixtures of tests/data/ (committed; CI reads them and needs no Python).

Needs `tiktoken` and `tokenizers` from PyPI (scripts/data_fixtures.sh makes a venv in /tmp).
Nothing is downloaded at run time: tiktoken's published encodings (GPT-2, cl100k) are fetched
from the network on first use, so instead a small byte-level BPE vocabulary is trained here with
`tokenizers` on the corpus below and written in both formats:

  bpe_gpt2.tokenizer.json     tokenizers' file: ByteLevel pre-tokenizer (GPT-2's regex)
  bpe_llama3.tokenizer.json   tokenizers' file: Split(Llama 3's regex) + ByteLevel, ignore_merges
  bpe.tiktoken                tiktoken's ranks file (bytes 0..255, then the merges in order)
  samples.json                the sample texts (UTF-8), as a JSON list
  reference.json              the ids tiktoken and tokenizers give for each sample
  llmc_gpt2.bin               an llm.c shard as llm.c's dev/data/data_common.py writes it

Usage: make_fixtures.py OUT_DIR
"""
import base64
import json
import os
import struct
import sys

import tiktoken
import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
LLAMA3_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""

SPECIALS = ["<|endoftext|>", "<|pad|>"]
VOCAB_SIZE = 1024

# The training corpus: written for these tests (no third-party text).
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog doesn't mind; it's sleeping.",
    "Training a language model starts with text, and text starts with tokens.",
    "We've seen that they'll tokenize the words they're given, and I'd say that's fine.",
    "In 2026 the cluster had 1024 GPUs, 128 nodes and 3.2 TB/s of bandwidth per node.",
    "def train(model, data):\n    for step, batch in enumerate(data):\n        loss = model(batch)\n",
    "Les élèves étudient à l'école; ça va très bien. Größe, Straße, Übung, naïve café.",
    "Москва — столица России. Привет, мир! Это пример текста на русском языке.",
    "東京は日本の首都です。機械学習のモデルを訓練する。中文文本也在这里。",
    "Emoji 🎉🚀 and symbols ∑ ∫ √ ≈ ≠ ← → appear in modern text too. 😀😀😀",
    "   Indented lines,\ttabs\tand  double  spaces\n\nblank lines and trailing spaces   \n",
    "Numbers: 0 1 12 123 1234 12345 3.14159 2,718 1e-9 0x1F 100% $42.00 -7",
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nHello, world!",
    "Shards hold tokens; loaders read shards; trainers read loaders. Repeat: tokens!",
] * 20

SAMPLES = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure they'll say we've done what you'd expect; it's DON'T and IT'S and They'RE.",
    "a  b   c    d\t\te\n\nf\n\n\ng   \n   h",
    "   leading spaces and trailing spaces   ",
    "\n\n\n",
    " ",
    "line one\r\nline two\r\n\r\nline four",
    "1234567890 3.14159 2026-11-28 1,000,000 007 x86_64 v1.2.3",
    "Les élèves étudient à l'école — ça va très bien. Größe naïve café.",
    "Привет, мир! Москва — столица.",
    "東京は日本の首都です。中文文本。한국어 텍스트.",
    "مرحبا بالعالم",
    "Emoji: 🎉🚀😀👩‍👩‍👧 flags 🇫🇷🇯🇵 and ∑∫√≈≠",
    "e\u0301 combining, zero\u200bwidth, no\u00a0break\u00a0space, ideographic\u3000space",
    "hello<|endoftext|>world<|endoftext|><|pad|>  <|endoftext|>\n",
    "<|endoftext|>",
    "!!! ??? ... --- *** ((( ))) [[[ ]]] {{{ }}}",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
    "TensorFlow's and PyTorch's APIs; GPT-2's tokenizer; llm.c's shards.",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "tokens tokens tokens tokenize tokenizer tokenizers tokenization",
    "\t\t\tTabs\tand\u000bvertical\u000cfeeds\u0085next line",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'x",
    "Numbers1234abc 12ab34 ab12cd a1b2c3 ١٢٣ ½ ²",
]


def train(pre_tokenizer, path, ignore_merges=False):
    model = models.BPE(ignore_merges=ignore_merges) if ignore_merges else models.BPE()
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    tok.save(path)
    return tok


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)

    gpt2 = train(pre_tokenizers.ByteLevel(add_prefix_space=False),
                 os.path.join(out, "bpe_gpt2.tokenizer.json"))
    llama3 = train(pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        os.path.join(out, "bpe_llama3.tokenizer.json"), ignore_merges=True)

    # tiktoken's ranks: the 256 bytes, then each merge of the GPT-2-style model in order.
    spec = json.load(open(os.path.join(out, "bpe_gpt2.tokenizer.json"), encoding="utf-8"))
    byte_decoder = {c: b for b, c in zip(range(256), _bytes_to_unicode())}
    to_bytes = lambda s: bytes(byte_decoder[ch] for ch in s)
    ranks = {bytes([b]): b for b in range(256)}
    for merge in spec["model"]["merges"]:
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        token = to_bytes(a) + to_bytes(b)
        if token not in ranks:
            ranks[token] = len(ranks)
    with open(os.path.join(out, "bpe.tiktoken"), "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    specials = {s: len(ranks) + i for i, s in enumerate(SPECIALS)}

    reference = {"tiktoken_version": tiktoken.__version__,
                 "tokenizers_version": tokenizers.__version__,
                 "tiktoken_specials": specials, "tiktoken": {}, "hf": {}}
    for name, pattern in [("gpt2", GPT2_PATTERN), ("cl100k", CL100K_PATTERN),
                          ("llama3", LLAMA3_PATTERN)]:
        enc = tiktoken.Encoding(name=f"fixture_{name}", pat_str=pattern, mergeable_ranks=ranks,
                                special_tokens=specials)
        reference["tiktoken"][name] = {
            "encode": [enc.encode(s, allowed_special="all") for s in SAMPLES],
            "encode_ordinary": [enc.encode_ordinary(s) for s in SAMPLES],
        }
        for ids, s in zip(reference["tiktoken"][name]["encode"], SAMPLES):
            assert enc.decode_bytes(ids) == s.encode("utf-8")
    # The GPT-2-style file with ByteLevel's add_prefix_space (the C++ test sets the same flag).
    gpt2_prefix = Tokenizer.from_file(os.path.join(out, "bpe_gpt2.tokenizer.json"))
    gpt2_prefix.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    for name, tok in [("gpt2", gpt2), ("llama3", llama3), ("gpt2_prefix_space", gpt2_prefix)]:
        reference["hf"][name] = [tok.encode(s, add_special_tokens=False).ids for s in SAMPLES]

    with open(os.path.join(out, "samples.json"), "w", encoding="utf-8") as f:
        json.dump(SAMPLES, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(reference, f, separators=(",", ":"))
        f.write("\n")

    # An llm.c shard, written as llm.c's write_datafile does for GPT-2: 256 int32 (magic,
    # version, count, zeros), then uint16 tokens.
    toks = reference["tiktoken"]["gpt2"]["encode"][2] + reference["tiktoken"]["gpt2"]["encode"][1]
    with open(os.path.join(out, "llmc_gpt2.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    with open(os.path.join(out, "llmc_gpt2.json"), "w") as f:
        json.dump(toks, f)
        f.write("\n")


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table, as a list indexed by byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


if __name__ == "__main__":
    main()
