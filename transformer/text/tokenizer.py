"""Joint byte-fallback BPE (Hugging Face ``tokenizers``), trained once and saved as ``tokenizer.json``.

Design: a SentencePiece-style pipeline that never splits on anything but spaces, so Chinese
and other unspaced scripts work. Text is normalised (NFC, runs of whitespace -> one space,
stripped, and ``▁`` read as a space; see ``Tokenizer.normalize``), spaces become ``▁``, and BPE merges run inside
``▁``-words. A character the vocabulary lacks is spelled as its UTF-8 bytes (``<0xE6>``...),
so nothing ever becomes ``<UNK>`` or vanishes. Decoding undoes all of it:
``decode(encode(s)) == normalize(s)`` for every string ``s``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from transformer.config import TokenizerConfig
from transformer.errors import ConfigError, DataError
from transformer.storage.files import atomic_file
from transformer.text.corpus import Corpus

_SPACE = "▁"
TAG = re.compile(r">>([A-Za-z][A-Za-z0-9_]*)<<")  # a target-language tag, OPUS-MT's convention
_BYTES = [f"<0x{b:02X}>" for b in range(256)]
_SAMPLE_SEED = 0
ONE_LINE = str.maketrans(dict.fromkeys("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029", " "))  # what str.splitlines splits at


class Tokenizer:
    """The project's one tokenizer: special tokens, encode/decode, save/load, fingerprint."""

    PAD, START, END, UNK = "<PAD>", "<START>", "<END>", "<UNK>"
    SPECIALS = (PAD, START, END, UNK)
    BT = "<BT>"  # starts a synthetic (back-translated) source, when a run tags them (data.synthetic_tag)
    PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3

    def __init__(self, hf: HFTokenizer) -> None:
        ids = [hf.token_to_id(t) for t in self.SPECIALS]
        if ids != [self.PAD_ID, self.START_ID, self.END_ID, self.UNK_ID]:
            raise DataError(f"tokenizer special tokens {self.SPECIALS} must have ids 0-3, found {ids}; retrain it")
        hf.encode_special_tokens = True  # a literal "<END>" in user text is text, not the END id
        self._hf = hf
        self.pad_id, self.start_id, self.end_id, self.unk_id = ids
        self.vocab_size: int = hf.get_vocab_size()
        self._byte_ids = np.array([hf.token_to_id(b) for b in _BYTES])
        added = hf.get_added_tokens_decoder().items()
        # the target-language tags, language -> id: special tokens after the vocabulary, never read from text
        self.tags = {m[1]: i for i, token in added if (m := TAG.fullmatch(token.content)) and token.special}
        self.bt_id: int | None = hf.token_to_id(self.BT)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
        """Learn merges from ``texts``; the vocabulary holds the 4 specials, 256 bytes and BPE tokens."""
        if vocab_size < len(cls.SPECIALS) + len(_BYTES) + 40:
            raise ConfigError(f"tokenizer.vocab_size {vocab_size} is too small; use at least 300")
        hf = _pipeline(models.BPE(unk_token=cls.UNK, byte_fallback=True))
        learned = vocab_size - len(_BYTES)
        trainer = trainers.BpeTrainer(
            vocab_size=learned,
            min_frequency=min_frequency,
            special_tokens=list(cls.SPECIALS),
            limit_alphabet=max(100, (learned - len(cls.SPECIALS)) // 2),
            show_progress=False,
        )
        hf.train_from_iterator(texts, trainer)
        return cls(_with_byte_tokens(hf))

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Read a ``tokenizer.json`` written by ``save``; DataError if missing or corrupt."""
        p = Path(path)
        if not p.is_file():
            raise DataError(f"tokenizer file '{p}' not found; train one (tfm train) or pass the run's tokenizer.json")
        try:
            hf = HFTokenizer.from_file(str(p))
        except Exception as e:  # tokenizers raises plain Exception for bad JSON
            raise DataError(
                f"tokenizer file '{p}' is corrupt ({str(e).splitlines()[0]}); restore or retrain it"
            ) from None
        return cls(hf)

    def with_tags(self, languages: Iterable[str]) -> Tokenizer:
        """This tokenizer with a target-language tag (``>>xx<<``) for each of ``languages`` it lacks."""
        return self.with_specials(tag(lang) for lang in sorted(set(languages) - set(self.tags)))

    def with_specials(self, tokens: Iterable[str]) -> Tokenizer:
        """This tokenizer with each of ``tokens`` it lacks as a special token appended to the vocabulary (the ids it
        had are kept); special tokens are never read from text and never decoded."""
        new = [t for t in dict.fromkeys(tokens) if self._hf.token_to_id(t) is None]
        if not new:
            return self
        hf = HFTokenizer.from_str(self.to_str())
        hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in new])
        return Tokenizer(hf)

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` atomically (``transformer.storage.files``)."""
        with atomic_file(path) as f:
            f.write(self.to_str())

    def to_str(self) -> str:
        """The serialized tokenizer (the content of ``tokenizer.json``)."""
        return self._hf.to_str()

    def fingerprint(self) -> str:
        """SHA-256 of the serialized tokenizer; checkpoints record it to refuse a mismatched tokenizer."""
        return hashlib.sha256(self.to_str().encode("utf-8")).hexdigest()

    def normalize(self, text: str) -> str:
        """What encode keeps of ``text``: NFC, ``▁`` and whitespace runs -> one space, stripped ends."""
        return self._hf.normalizer.normalize_str(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no <START>/<END> added."""
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many texts at once (parallel, in Rust)."""
        return [e.ids for e in self._hf.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Clean text: special tokens skipped, ``▁`` turned back into spaces, byte tokens into characters, and a
        character that ends a line (a model may write the byte of a newline) a space: a translation is one line."""
        return self._hf.decode(list(ids), skip_special_tokens=True).translate(ONE_LINE)

    def decode_batch(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """``decode`` for many id lists."""
        return [t.translate(ONE_LINE) for t in self._hf.decode_batch([list(x) for x in ids], skip_special_tokens=True)]

    def id_to_token(self, i: int) -> str | None:
        """The token string of id ``i`` (for debugging and tests)."""
        return self._hf.id_to_token(i)

    def unk_rate(self, texts: Iterable[str]) -> float:
        """Share of tokens that stand for characters outside the vocabulary (<UNK> or byte fallback)."""
        unknown = total = 0
        for chunk in _chunks(texts, 10_000):
            for ids in self.encode_batch(chunk):
                a = np.asarray(ids)
                total += a.size
                unknown += int(np.isin(a, self._byte_ids).sum() + (a == self.unk_id).sum())
        return unknown / total if total else 0.0


def tag(language: str) -> str:
    """The tag that asks a multilingual model for ``language``: ``>>fr<<``."""
    return f">>{language}<<"


def _pipeline(model: models.Model) -> HFTokenizer:
    """A tokenizer around ``model`` with the normaliser, pre-tokenizer and decoder described above."""
    hf = HFTokenizer(model)
    hf.normalizer = normalizers.Sequence(
        [
            normalizers.NFC(),
            normalizers.Replace(_SPACE, " "),
            normalizers.Replace(Regex(r"\s+"), " "),
            normalizers.Strip(),
        ]
    )
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="always", split=True)
    hf.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return hf


def _with_byte_tokens(hf: HFTokenizer) -> HFTokenizer:
    """Renumber the trained vocabulary as specials (0-3), the 256 byte tokens (4-259), then BPE tokens."""
    spec = json.loads(hf.to_str())
    trained = spec["model"]["vocab"]
    vocab: dict[str, int] = {}
    for token in [*Tokenizer.SPECIALS, *_BYTES, *sorted(trained, key=trained.get)]:
        vocab.setdefault(token, len(vocab))
    spec["model"]["vocab"] = vocab
    return HFTokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def _chunks(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    """Consecutive lists of at most ``size`` texts."""
    chunk: list[str] = []
    for t in texts:
        chunk.append(t)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _sample(corpus: Corpus, n: int, sides: tuple[str, ...] = ("src", "tgt")) -> Iterator[str]:
    """``sides`` of ``n`` pairs drawn without replacement (seeded), or of every pair if fewer."""
    if n >= len(corpus):
        rows: Iterable[int] = range(len(corpus))
    else:
        rows = np.sort(np.random.default_rng(_SAMPLE_SEED).choice(len(corpus), size=n, replace=False)).tolist()
    columns = [getattr(corpus, side) for side in sides]
    for i in rows:
        for column in columns:
            yield column[i]


def train_tokenizer(cfg: TokenizerConfig, corpus: Corpus) -> Tokenizer:
    """Train the joint tokenizer on both sides of ``cfg.train_sample`` pairs of ``corpus``."""
    _check_joint(cfg)
    return Tokenizer.train(_sample(corpus, cfg.train_sample), cfg.vocab_size, cfg.min_frequency)


def train_multilingual(cfg: TokenizerConfig, corpora: dict[tuple[str, str], Corpus]) -> Tokenizer:
    """One tokenizer over every language of ``corpora`` (keyed by source and target language), each language's
    text read once (``cfg.train_sample`` sentences of it, from the first corpus holding it), with the tags of every
    target language."""
    _check_joint(cfg)
    seen: set[str] = set()
    texts: list[Iterator[str]] = []
    for (src, tgt), corpus in corpora.items():
        sides = tuple(side for side, lang in (("src", src), ("tgt", tgt)) if lang not in seen)
        seen |= {src, tgt}
        if sides:
            texts.append(_sample(corpus, cfg.train_sample, sides))
    tokenizer = Tokenizer.train(chain.from_iterable(texts), cfg.vocab_size, cfg.min_frequency)
    return tokenizer.with_tags(tgt for _, tgt in corpora)


def _check_joint(cfg: TokenizerConfig) -> None:
    if not cfg.joint:
        raise ConfigError(
            "tokenizer.joint: false (separate vocabularies) is not supported yet; set tokenizer.joint: true"
        )
