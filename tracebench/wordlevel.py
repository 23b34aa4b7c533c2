"""The word-level tokenizer of the GPU setup and of the simulator: token id i is the word `w<i>` (ids 3..V-1; 0, 1, 2
are `<unk>`, `<s>`, `</s>`), split on whitespace, nothing added. One word is one token, so a text prompt of n words
is n tokens on real sglang (with these files in its model folder) and on the sim-server alike.

The files are made, not stored (half a megabyte of `"w<i>": i`):

    python -m tracebench.wordlevel DIR [--vocab-size 32000]   # writes DIR/tokenizer.json, tokenizer_config.json,
                                                              # special_tokens_map.json (what sglang's text mode reads)

`tracebench record --tokenizer wordlevel` reads the same tokenizer without any file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

VOCAB_SIZE = 32000  # llama-2's
SPECIAL = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # the message text, nothing added


def tokenizer_spec(vocab_size: int = VOCAB_SIZE) -> dict:
    """tokenizer.json as a `tokenizers` WordLevel model with a WhitespaceSplit pre-tokenizer."""
    vocab = {word: i for i, word in enumerate(SPECIAL)}
    vocab.update((f"w{i}", i) for i in range(len(SPECIAL), vocab_size))
    added = [{"id": i, "content": word, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, word in enumerate(SPECIAL)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


def tokenizer_files(vocab_size: int = VOCAB_SIZE) -> dict[str, str]:
    """File name -> content of the tokenizer folder sglang loads in text mode."""
    return {
        "tokenizer.json": json.dumps(tokenizer_spec(vocab_size)),
        "tokenizer_config.json": json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
            "model_max_length": 4096, "add_bos_token": False, "chat_template": CHAT_TEMPLATE}),
        "special_tokens_map.json": json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write the word-level tokenizer's files into a folder.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    opts = parser.parse_args(argv)
    opts.folder.mkdir(parents=True, exist_ok=True)
    for name, text in tokenizer_files(opts.vocab_size).items():
        (opts.folder / name).write_text(text)
    print(opts.folder)


if __name__ == "__main__":
    main()
