"""The simulator's tokenizer as Hugging Face files (``chunkpilot sim tokenizer --out DIR``).

Benchmark clients (aiperf, guidellm, vLLM's ``benchmark_serving``) count tokens with a Hugging
Face tokenizer named by ``--tokenizer``. The folder written here holds a ``tokenizer.json`` whose
pre-tokenizer splits text exactly as :mod:`chunkpilot.engine.sim.tokenizer` does (the same piece
regex, then chunks of at most four characters) and whose word-level model maps every chunk to
one token, so a client's counts equal the simulator's for any text. Ids of the vocabulary's chunks
equal the simulator's ids; any other chunk is the unknown token, which decodes to
:data:`~chunkpilot.engine.sim.tokenizer.UNKNOWN_TEXT` (one token again). The chat template in
``tokenizer_config.json`` reproduces the simulator's chat overhead (four tokens per message, three
for the reply) with added tokens, so ``--apply-chat-template`` style counts match too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from chunkpilot.engine.sim import tokenizer

MESSAGE_TOKEN = "<|chunkpilot_message|>"
REPLY_TOKEN = "<|chunkpilot_reply|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    + MESSAGE_TOKEN * tokenizer.CHAT_TOKENS_PER_MESSAGE
    + "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}"
    + REPLY_TOKEN * tokenizer.CHAT_TOKENS_PER_REPLY
    + "{% endif %}"
)


def tokenizer_json(vocab_size: int) -> dict[str, Any]:
    """The ``tokenizer.json`` document for a model with ``vocab_size`` token ids."""
    vocab = tokenizer.vocabulary(vocab_size)
    added = [
        {
            "id": len(vocab) + i,
            "content": text,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, text in enumerate((MESSAGE_TOKEN, REPLY_TOKEN))
    ]
    split = {"type": "Split", "behavior": "Isolated", "invert": False}
    pieces = tokenizer.piece_pattern("\\x{{{:x}}}")
    chunk = f"[\\s\\S]{{1,{tokenizer.CHARS_PER_TOKEN}}}"
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {**split, "pattern": {"Regex": pieces}},
                {**split, "pattern": {"Regex": chunk}},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {
            "type": "WordLevel",
            "vocab": {text: i for i, text in enumerate(vocab)},
            "unk_token": tokenizer.UNKNOWN_TEXT,
        },
    }


def tokenizer_config(max_model_len: int) -> dict[str, Any]:
    """The ``tokenizer_config.json`` document (``transformers.AutoTokenizer`` reads it)."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_model_len,
        "clean_up_tokenization_spaces": False,
        # No ``unk_token``: transformers would make it special and drop it from decoded text
        # (``skip_special_tokens``), so prompts that clients build by decoding token ids would
        # re-tokenize shorter. Undeclared, it decodes to U+FFFD: one token again.
        "additional_special_tokens": [MESSAGE_TOKEN, REPLY_TOKEN],
        "chat_template": CHAT_TEMPLATE,
    }


def model_config(vocab_size: int, max_model_len: int) -> dict[str, Any]:
    """A minimal ``config.json``: ``AutoTokenizer`` reads one when loading a repository by name."""
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab_size,
        "max_position_embeddings": max_model_len,
    }


def _texts(vocab_size: int, max_model_len: int) -> dict[str, str]:
    documents = {
        "tokenizer.json": tokenizer_json(vocab_size),
        "tokenizer_config.json": tokenizer_config(max_model_len),
        "config.json": model_config(vocab_size, max_model_len),
    }
    return {name: json.dumps(doc, ensure_ascii=False) + "\n" for name, doc in documents.items()}


def export(out: Path, vocab_size: int, max_model_len: int) -> list[Path]:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``config.json`` into ``out``; return
    their paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in _texts(vocab_size, max_model_len).items():
        (out / name).write_text(text, encoding="utf-8")
        written.append(out / name)
    return written


def export_to_hub_cache(cache: Path, repo_id: str, vocab_size: int, max_model_len: int) -> Path:
    """Install the files as the cached snapshot of Hugging Face repository ``repo_id`` in hub cache
    ``cache`` (what ``HF_HUB_CACHE`` names), so that clients which load a tokenizer by name find it
    with ``HF_HUB_OFFLINE=1``; return the snapshot folder."""
    parts = repo_id.split("/")
    if not 1 <= len(parts) <= 2 or not all(p and p not in {".", ".."} and "--" not in p for p in parts):
        raise ValueError(f"--name must look like 'name' or 'namespace/name', got {repo_id!r}")
    texts = _texts(vocab_size, max_model_len)
    revision = hashlib.sha1("".join(texts.values()).encode()).hexdigest()
    repo = cache / ("models--" + "--".join(parts))
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (snapshot / name).write_text(text, encoding="utf-8")
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
