#!/usr/bin/env python3
"""Expected token ids for the byte-level BPE tokenizer's test on the real SmolLM2 file
(bpe.rs, `real_smollm2_tokenizer`), written to bpe_reference.json next to this script.

Usage: python3 bpe_reference.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]
Needs: pip install gguf tokenizers   (produced with gguf 0.19.0, tokenizers 0.23.3)

The reference is the Hugging Face `tokenizers` library, built from the GGUF's own
vocabulary and merges (not from a tokenizer.json), with the pre-tokenizer llama.cpp uses
for tokenizer.ggml.pre = "smollm": Sequence[Digits(individual_digits=True),
ByteLevel(add_prefix_space=False, use_regex=True)], and the control tokens (token type 3)
and user-defined tokens (type 4) added as special tokens, matched literally.

The cases are a fixed list (English, numbers, punctuation, whitespace runs, Unicode,
contractions, code, special tokens, the chat prompt) plus seeded random strings built
from pieces that stress the pre-tokenizer. Characters whose Unicode category differs
from Rust's char::is_alphabetic (combining vowel signs, circled letters) are avoided on
purpose: bpe.rs documents that approximation.
"""
import json
import os
import random
import sys

from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

here = os.path.dirname(os.path.abspath(__file__))
default = os.path.join(here, "..", "..", "..", "..", "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
path = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("POLYATTN_SMOLLM2_GGUF", default)
reader = GGUFReader(path)


def field(name):
    return reader.fields[name].contents()


assert field("tokenizer.ggml.model") == "gpt2"
assert field("tokenizer.ggml.pre") == "smollm"
tokens = field("tokenizer.ggml.tokens")
types = field("tokenizer.ggml.token_type")
merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]

tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False, byte_fallback=False))
tok.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (3, 4)])

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat_prompt(user):
    # The chat template in tokenizer.chat_template for one user message, with the default
    # system message and add_generation_prompt=True.
    return f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


CASES = [
    "Hello, world! This is a short English sentence to test the tokenizer.",
    "The capital of France is",
    "12345 3.14",
    "Wait... what?! (yes) [no] {maybe} -- \"quoted\" #tag @user $5.00 100% a+b=c; x<y>z ~/.rc",
    "a  b   c\n\nd \n e\t\tf    \n\n  g  ",
    "café naïve 日本語 🙂",
    "don't it's I'm we'll they've you're he'd DON'T o'clock '' 's",
    chat_prompt("What is the capital of France?"),
    'fn main() {\n    println!("hi {}", 42);\n}\n',
    "",
    "   leading and trailing   ",
    "<|im_start|><|im_end|>x<|endoftext|> <|im_start|",
    "abc123def 4x4 ½ ² ٣ 2024-01-02",
    "cafe\u0301 \u00a0nbsp\u00a0 line\r\nbreak",
]

PIECES = [
    "a", "the", "The", "ing", "ABC", "x", " ", "  ", "   ", "\n", "\n\n", "\t", "\r\n",
    "'", "'s", "'t", "'re", "'ll", "n't", "0", "7", "12", "3.5", ".", ",", "!?", "...", "-",
    "(", ")", "\"", "é", "ß", "Ω", "日本", "🙂", "½", "\u00a0", "<|im_end|>", "<|im_start|>",
    "<repo_name>", "<|", "|>", "$", "_", "@@",
]
# Bytes whose byte-level symbol is not in SmolLM2's vocabulary (0x04, 0x06, 0x13, 0x14,
# 0x16, 0x1d, and the UTF-8 lead bytes 0xf1, 0xf2 of U+40000..U+BFFFF) are dropped by
# the reference, as by llama.cpp; these cases do not round-trip.
LOSSY = ["x\x04y\x06z \x13\x14\x16\x1d end", "plane 4: \U00040000!"]

rng = random.Random(20240601)
for _ in range(120):
    CASES.append("".join(rng.choice(PIECES) for _ in range(rng.randint(1, 12))))

out = []
for text in CASES:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) == text, text
    out.append({"text": text, "ids": ids})
for text in LOSSY:
    ids = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids, skip_special_tokens=False) != text, text
    out.append({"text": text, "ids": ids, "lossy": True})

dest = os.path.join(here, "bpe_reference.json")
with open(dest, "w", encoding="utf-8") as f:
    json.dump({"chat_user": "What is the capital of France?", "cases": out}, f, ensure_ascii=False, separators=(",", ":"))
    f.write("\n")
print(f"wrote {len(out)} cases to {dest}")
