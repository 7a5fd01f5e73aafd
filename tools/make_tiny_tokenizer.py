#!/usr/bin/env python3
"""Build the small byte-level BPE tokenizer that ships with the embedded tiny Gemma 4 checkpoint.

Plain Python (no third-party modules), deterministic: the same code always writes the same bytes.

Layout of the vocabulary (ids match Gemma conventions for the specials):
    0 <pad>, 1 <eos>, 2 <bos>          special tokens (also listed in added_tokens)
    3 .. 258                           the 256 single bytes, in byte order, spelled GPT-2 style
                                       (each byte mapped to one printable unicode character)
    259 .. VOCAB_SIZE-1                merges learned from TRAINING_TEXT below, in merge order

tokenizer.json uses the Hugging Face `tokenizers` format:
    normalizer      none
    pre_tokenizer   Sequence[ Split(GPT-2 regex, Isolated), ByteLevel(use_regex=false) ]
                    (the same shape as Qwen3's tokenizer.json, so a reader that handles Qwen3 handles this)
    model           BPE, merges as [left, right] pairs, no unk token, no byte fallback
    post_processor  TemplateProcessing: <bos> before the sequence
    decoder         ByteLevel

Usage:  python3 tools/make_tiny_tokenizer.py --out DIR     (writes DIR/tokenizer.json, DIR/tokenizer_config.json)
        python3 tools/make_tiny_tokenizer.py --encode "some text"   (prints ids from the pure-Python encoder)
tools/gen_reference.py imports this module and checks the file with the real `tokenizers` library.
"""

import argparse
import collections
import json
import os
import re
import sys

VOCAB_SIZE = 512
SPECIALS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2
PAD_ID, EOS_ID, BOS_ID = 0, 1, 2
FIRST_BYTE_ID = len(SPECIALS)

# GPT-2 pre-tokenizer pattern (the one ByteLevel(use_regex=true) applies internally), written out explicitly.
GPT2_SPLIT_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The same pattern restricted to ASCII, for Python's `re` (which has no \p{..}); used only on ASCII text.
_ASCII_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

# Training text: written for this project (no third-party text), plain ASCII English.
TRAINING_TEXT = """
The harbour was quiet in the early morning. A small boat came in with the tide, and the people on the
quay watched it find its berth between the larger ships. Nobody was in a hurry. The fishermen sorted
their nets, the gulls waited on the posts, and the water moved slowly against the stones.

A runtime for language models is a little like that harbour. Many different ships arrive, each with its
own shape and its own cargo, and each one needs a place to stay while it is unloaded. The host gives every
model a berth: it reads the configuration, opens the weights, finds a backend that can do the work, and
keeps the memory in order. The model only has to describe the steps of its forward pass.

When a prompt arrives, the text is split into tokens. Each token is a number, and the numbers are looked up
in a table of vectors. The vectors pass through the layers one after another. In every layer the model
looks back at the tokens that came before, mixes what it finds, and passes the result to the next layer.
At the end, the last vector is compared with every entry of the table, and the scores say which token
should come next. The chosen token is added to the text, and the whole process starts again.

This is a tiny model with random weights, so the text it writes is noise. It cannot answer questions or
tell stories. It exists so that the tests can run the whole path from text to text on a small machine,
in a fraction of a second, and compare every number with the reference that was computed in Python.
If the numbers agree, the loader, the tokenizer, the attention, the cache and the sampler all did their
part. If they do not agree, the test says where the first difference was found.

The weather changed in the afternoon. Clouds came over the hills, the wind turned to the west, and the
boats that were still out came home early. The harbour master wrote the times in his book: the first boat
at three, the second at half past three, the last one just before five. Then he closed the book, put on
his coat, and walked along the quay to see that every rope was tied and every light was working.

There are many ways to make a program fast. One is to do less work: keep the results that will be needed
again, and skip the parts that cannot change the answer. Another is to do the same work with fewer
instructions, using wide registers that handle many numbers at once. A third is to spread the work over
many cores, or over a graphics card with thousands of small units. Each of these has a cost, and the best
choice depends on the size of the model, the length of the text, and the machine that runs it.

Good tests are small, fast and exact. They state what the program should do, they fail when it does not,
and they say why. A test that cannot fail is worse than no test at all, because it gives a feeling of
safety that is not true. The reference numbers in this folder were made once, on a machine with the full
Python stack, and they are stored next to the checkpoint they belong to. The tests read them with a
plain C library and never need Python again.

In the evening the wind fell and the sky cleared. The lights of the town came on one by one, and their
reflections stretched across the water. Somewhere a radio was playing, and somewhere else a door was
closed. The small boat that had come in with the morning tide was still in its berth, tied fore and aft,
rocking gently as the last waves of the day reached the shore. Tomorrow it would go out again.
"""


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character table.

    Printable Latin-1 bytes keep their own character; the other 68 bytes are moved to U+0100 and up, in
    byte order, so that no byte maps to whitespace or a control character.
    """
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    shifted = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + shifted)
            shifted += 1
    return table


BYTE_CHAR = bytes_to_unicode()


def pretokenize_ascii(text):
    """Split ASCII text like the GPT-2 regex does (the pattern is equivalent on ASCII input)."""
    if any(ord(c) > 0x7F for c in text):
        raise ValueError("pretokenize_ascii: text contains non-ASCII characters; use the tokenizers library")
    return _ASCII_SPLIT.findall(text)


def to_byte_chars(piece):
    return "".join(BYTE_CHAR[b] for b in piece.encode("utf-8"))


def train_merges(text, num_merges):
    """Learn `num_merges` BPE merges from `text`. Ties: highest count, then smallest (left, right) pair."""
    word_counts = collections.Counter(to_byte_chars(p) for p in pretokenize_ascii(text))
    words = {w: list(w) for w in word_counts}  # word -> current symbol list
    known = set(BYTE_CHAR.values()) | set(SPECIALS)
    merges = []
    while len(merges) < num_merges:
        pair_counts = collections.Counter()
        for w, syms in words.items():
            c = word_counts[w]
            for a, b in zip(syms, syms[1:]):
                pair_counts[(a, b)] += c
        best = None
        for pair, c in pair_counts.items():
            if c < 2 or (pair[0] + pair[1]) in known:  # a new token must be new and seen twice
                continue
            if best is None or c > best[1] or (c == best[1] and pair < best[0]):
                best = (pair, c)
        if best is None:
            raise RuntimeError(f"train_merges: only {len(merges)} merges learnable from the text, "
                               f"{num_merges} wanted; add training text")
        (a, b), _ = best
        merged = a + b
        merges.append((a, b))
        known.add(merged)
        for w, syms in words.items():
            i, out = 0, []
            while i < len(syms):
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            words[w] = out
    return merges


class TinyTokenizer:
    """The vocabulary plus a pure-Python encoder (ASCII text only) used to cross-check `tokenizers`."""

    def __init__(self, vocab_size=VOCAB_SIZE, text=TRAINING_TEXT):
        num_merges = vocab_size - len(SPECIALS) - 256
        if num_merges < 0:
            raise ValueError(f"vocab_size {vocab_size} is smaller than {len(SPECIALS) + 256}")
        self.merges = train_merges(text, num_merges)
        self.vocab = {}
        for i, s in enumerate(SPECIALS):
            self.vocab[s] = i
        for b in range(256):
            self.vocab[BYTE_CHAR[b]] = FIRST_BYTE_ID + b
        for a, b in self.merges:
            self.vocab[a + b] = len(self.vocab)
        if len(self.vocab) != vocab_size:
            raise RuntimeError(f"vocab has {len(self.vocab)} entries, expected {vocab_size} (duplicate token?)")
        self.rank = {pair: i for i, pair in enumerate(self.merges)}
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.char_to_byte = {c: b for b, c in BYTE_CHAR.items()}

    def _bpe(self, word):
        syms = list(word)
        while len(syms) > 1:
            best_rank, best_i = None, None
            for i in range(len(syms) - 1):
                r = self.rank.get((syms[i], syms[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best_rank, best_i = r, i
            if best_rank is None:
                break
            a, b = syms[best_i], syms[best_i + 1]
            out, i = [], 0
            while i < len(syms):  # merge every occurrence of the best pair, left to right
                if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(syms[i])
                    i += 1
            syms = out
        return syms

    def encode(self, text, add_bos=True):
        ids = [BOS_ID] if add_bos else []
        for piece in pretokenize_ascii(text):
            ids.extend(self.vocab[s] for s in self._bpe(to_byte_chars(piece)))
        return ids

    def decode(self, ids, skip_special=True):
        out = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if i < FIRST_BYTE_ID:
                if not skip_special:
                    out.extend(t.encode("utf-8"))
                continue
            out.extend(self.char_to_byte[c] for c in t)
        return out.decode("utf-8", errors="replace")

    def tokenizer_json(self):
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
        bos = SPECIALS[BOS_ID]
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {
                "type": "Sequence",
                "pretokenizers": [
                    {"type": "Split", "pattern": {"Regex": GPT2_SPLIT_REGEX}, "behavior": "Isolated",
                     "invert": False},
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
                ],
            },
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {bos: {"id": bos, "ids": [BOS_ID], "tokens": [bos]}},
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": False,
                "vocab": self.vocab,
                "merges": [[a, b] for a, b in self.merges],
            },
        }

    def tokenizer_config_json(self):
        return {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": SPECIALS[BOS_ID],
            "eos_token": SPECIALS[EOS_ID],
            "pad_token": SPECIALS[PAD_ID],
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 256,
            "added_tokens_decoder": {
                str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True} for i, s in enumerate(SPECIALS)},
        }

    def write(self, out_dir):
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for name, obj in (("tokenizer.json", self.tokenizer_json()),
                          ("tokenizer_config.json", self.tokenizer_config_json())):
            path = os.path.join(out_dir, name)
            with open(path, "w", encoding="utf-8") as f:
                json.dump(obj, f, ensure_ascii=False, indent=2)
                f.write("\n")
            paths.append(path)
        return paths


# Strings used to check the file against the `tokenizers` library (ASCII ones are also compared id by id
# with the pure-Python encoder above; the others only round-trip).
CHECK_STRINGS_ASCII = [
    "The harbour was quiet in the early morning.",
    "Hello, world! 1234 tokens; don't stop.",
    "  leading spaces and\ttabs\nand new lines  ",
    "a",
    "",
]
CHECK_STRINGS_UNICODE = ["caf\u00e9 na\u00efve \u00fcber", "\u65e5\u672c\u8a9e \U0001F600 \u0394x"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="folder to write tokenizer.json and tokenizer_config.json into")
    ap.add_argument("--encode", help="print the ids of this ASCII text (pure-Python encoder, with <bos>)")
    args = ap.parse_args(argv)
    tok = TinyTokenizer()
    if args.encode is not None:
        print(json.dumps(tok.encode(args.encode)))
    if args.out:
        for p in tok.write(args.out):
            print("wrote", p)
    if not args.out and args.encode is None:
        ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
