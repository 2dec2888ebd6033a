"""The exported Hugging Face tokenizer counts (and, for vocabulary chunks, ids) exactly as the
simulator's own tokenizer, checked with the ``tokenizers`` library on arbitrary text."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from chunkpilot.engine.sim import hf_tokenizer, tokenizer
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

VOCAB = 128256  # llama-3.1-8b


def _sim_tokenizer(*args: str) -> subprocess.CompletedProcess[str]:
    """``chunkpilot sim tokenizer ARGS`` in a child process, its output captured."""
    argv = [sys.executable, "-m", "chunkpilot.cli", "sim", "tokenizer", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    result = _sim_tokenizer("--out", str(out), "--model", "llama-3.1-8b")
    assert result.returncode == 0, result.stderr
    names = ["tokenizer.json", "tokenizer_config.json", "config.json"]
    assert result.stdout.split() == [str(out / name) for name in names]
    return out


@pytest.fixture(scope="module")
def hf(exported: Path) -> Tokenizer:
    return Tokenizer.from_file(str(exported / "tokenizer.json"))


# Unicode text without lone surrogates (which are not text and which the server refuses), with the
# characters the piece regex treats specially made frequent.
TEXT = st.text(
    alphabet=st.one_of(
        st.characters(blacklist_categories=("Cs",)),
        st.sampled_from([chr(c) for c in tokenizer.WHITESPACE_CODEPOINTS]),
        st.sampled_from(list("aZ09 .,'-")),
    ),
    max_size=300,
)


@settings(max_examples=300, deadline=None, database=None)
@given(text=TEXT)
def test_counts_equal_the_simulators_on_any_text(hf: Tokenizer, text: str) -> None:
    encoding = hf.encode(text, add_special_tokens=False)
    assert len(encoding.ids) == tokenizer.count_tokens(text) == len(tokenizer.encode(text, VOCAB))
    assert encoding.tokens == [t if t in _vocab() else tokenizer.UNKNOWN_TEXT for t in tokenizer.pieces(text)]


@functools.cache
def _vocab() -> dict[str, int]:
    return {t: i for i, t in enumerate(tokenizer.vocabulary(VOCAB))}


def test_vocabulary_ids_and_decoding_round_trip(hf: Tokenizer) -> None:
    text = tokenizer.TextGenerator("round trip").tokens(500) + " 42 cats,  and\n\ttea."
    ids = hf.encode(text, add_special_tokens=False).ids
    assert ids == tokenizer.encode(text, VOCAB)
    assert hf.decode(ids) == text
    assert hf.get_vocab_size() <= VOCAB


def test_unknown_chunks_decode_to_one_token(hf: Tokenizer) -> None:
    text = "Shall I compare thee"
    ids = hf.encode(text, add_special_tokens=False).ids
    decoded = hf.decode(ids)
    assert tokenizer.UNKNOWN_TEXT in decoded
    assert tokenizer.count_tokens(decoded) == len(ids)


def test_config_declares_the_chat_tokens_and_no_cleanup(exported: Path, hf: Tokenizer) -> None:
    config = json.loads((exported / "tokenizer_config.json").read_text())
    assert config["clean_up_tokenization_spaces"] is False
    assert "unk_token" not in config  # special tokens are dropped when clients decode prompts
    assert config["additional_special_tokens"] == [hf_tokenizer.MESSAGE_TOKEN, hf_tokenizer.REPLY_TOKEN]
    # What the chat template renders for one message: four message tokens, content, three reply tokens.
    content = "What is chunked prefill?"
    rendered = hf_tokenizer.MESSAGE_TOKEN * 4 + content + hf_tokenizer.REPLY_TOKEN * 3
    count = len(hf.encode(rendered, add_special_tokens=False).ids)
    assert count == len(tokenizer.encode_chat([("user", content)], VOCAB))


def test_small_vocabularies_leave_room_for_the_chat_tokens() -> None:
    document = hf_tokenizer.tokenizer_json(32768)
    ids = [*document["model"]["vocab"].values(), *(t["id"] for t in document["added_tokens"])]
    assert max(ids) == 32767 and len(set(ids)) == len(ids)


def test_unknown_model_is_a_one_line_error(tmp_path: Path) -> None:
    result = _sim_tokenizer("--out", str(tmp_path), "--model", "nope")
    assert result.returncode == 2 and result.stderr.startswith(
        "chunkpilot sim tokenizer: error: unknown model"
    )


def test_hub_cache_install_is_a_loadable_snapshot(tmp_path: Path) -> None:
    result = _sim_tokenizer("--hub-cache", str(tmp_path), "--name", "org/sim-model")
    assert result.returncode == 0, result.stderr
    snapshot = Path(result.stdout.strip())
    repo = tmp_path / "models--org--sim-model"
    assert snapshot.parent == repo / "snapshots" and (repo / "refs" / "main").read_text() == snapshot.name
    hf = Tokenizer.from_file(str(snapshot / "tokenizer.json"))
    assert len(hf.encode("Hello world", add_special_tokens=False).ids) == tokenizer.count_tokens(
        "Hello world"
    )
    bad = _sim_tokenizer("--hub-cache", str(tmp_path), "--name", "a/b/c")
    assert bad.returncode == 2 and "--name must look like" in bad.stderr
