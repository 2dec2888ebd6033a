"""Create a tiny Llama-architecture model folder for exercising vLLM without downloads.

The folder holds ``config.json`` (small dimensions) and a byte-level BPE
tokenizer trained here with ``tokenizers`` (``tokenizer.json`` and
``tokenizer_config.json``). There are no weights: serve it with
``--load-format dummy``. Run inside the engine environment, which has
``tokenizers``::

    python -m chunkpilot.engine.vllm_plugin.tiny_model OUT_DIR
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

VOCAB_SIZE = 512
MAX_POSITION_EMBEDDINGS = 32768
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>")

_WORDS = (
    "token", "budget", "prefill", "decode", "chunk", "stream", "latency", "scheduler", "request",
    "prompt", "cache", "block", "engine", "model", "tensor", "batch", "kernel", "memory",
    "service", "replica", "canary", "trial", "budget", "the", "a", "of", "to", "and", "in", "is",
    "for", "on", "with", "as", "by", "at", "from", "it", "that", "this", "be", "are", "was",
)  # fmt: skip


def llama_config(
    vocab_size: int = VOCAB_SIZE, max_positions: int = MAX_POSITION_EMBEDDINGS
) -> dict[str, object]:
    """A small Llama configuration: cheap steps whose cost still grows with tokens."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def _corpus(lines: int, seed: int = 7) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(lines):
        yield " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 30)))


def write_tiny_model(out: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Write the model folder (idempotent) and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # type: ignore[import-not-found,unused-ignore]

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(2000), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": MAX_POSITION_EMBEDDINGS,
                "chat_template": (
                    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                    "{% if add_generation_prompt %}assistant: {% endif %}"
                ),
            },
            indent=2,
        )
    )
    config = llama_config(vocab_size=tokenizer.get_vocab_size())
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out", type=Path, help="folder to create")
    args = parser.parse_args(argv)
    print(write_tiny_model(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
