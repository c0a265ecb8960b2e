"""Translator: text in, text out, through the tokenizer, the model and the search.

Lines are cleaned (BOM, CR, control characters), streamed in chunks, sorted by
length inside a chunk and batched by tokens, then put back in input order: one
output per input line, an empty line for an empty line, whatever the batch size.
"""

from __future__ import annotations

import copy
import re
import sys
import unicodedata
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch

from transformer.checkpoint import Loaded, load
from transformer.config import Config, DecodeConfig, check_decode
from transformer.decoding.ensemble import Ensemble, check_members
from transformer.decoding.search import Hypothesis, beam_finished, beam_search, greedy_search, ranked
from transformer.errors import ConfigError, TranslateError
from transformer.measured import decoding_precision
from transformer.model.decoding_copy import decoding_model
from transformer.model.speed import shape_changing_attention
from transformer.model.transformer import Transformer
from transformer.runtime.device import resolve_device
from transformer.runtime.precision import autocast, check_precision
from transformer.runtime.process import decoding_threads
from transformer.text.batching import sorted_batches, source_tensor
from transformer.text.tokenizer import TAG, Tokenizer

_SPACES = re.compile(r"\s+")
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_line(line: str) -> str:
    """Strip BOM and line ends, turn control characters into spaces and collapse whitespace.

    Lone surrogates (how Python keeps undecodable bytes, e.g. from ``sys.argv``) become U+FFFD:
    they are not text, and the tokenizer cannot encode them.
    """
    line = _SURROGATES.sub("\ufffd", line.replace("\ufeff", ""))
    line = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in line)
    return _SPACES.sub(" ", line).strip()


def source_line(line: str, lowercase: bool) -> str:
    """A line as the model reads it: cleaned, and lowercased for a model trained on lowercased text (data.lowercase).

    Everything that encodes user input (translation, the server's length check, attention maps) goes through here,
    so that all of them see the tokens the model will.
    """
    return clean_line(line.lower() if lowercase else line)


def target_of(cfg: Config, language: str | None) -> str:
    """The language a model of ``cfg`` translates into when asked for ``language`` (None: its only target); a
    language it does not translate into, or None for a model of several, is refused naming its targets."""
    targets = sorted({tgt for _, tgt in cfg.data.pairs()})
    known = ", ".join(targets)
    if language is None and len(targets) > 1:
        raise ConfigError(f"the model translates into {known}; say which with --to (e.g. --to {targets[0]})")
    if language is not None and language not in targets:
        raise ConfigError(f"the model does not translate into '{language}'; its target languages: {known}")
    return language or targets[0]


@dataclass
class Translation:
    """The n-best hypotheses of one input line, best first, as text and scores."""

    texts: list[str]
    scores: list[float]

    @property
    def best(self) -> str:
        """The 1-best text ('' for an empty input)."""
        return self.texts[0] if self.texts else ""


@dataclass(frozen=True)
class TranslateOptions:
    """How to translate, as a command or the trainer's validation asks: the device and precision to decode in
    (precision.PRECISIONS or auto), and the decode settings given over the checkpoint's (None: the checkpoint's)."""

    device: str | torch.device = "auto"
    precision: str = "fp32"
    beam: int | None = None
    nbest: int | None = None
    alpha: float | None = None
    batch_tokens: int | None = None
    to: str | None = None

    def __post_init__(self) -> None:
        """The device and the precision are checked as they come in: a device this machine has (kept as a torch
        device), a precision it decodes in there."""
        object.__setattr__(self, "device", resolve_device(str(self.device)))
        check_precision(self.precision, self.device, training=False)


class Translator:
    """``model`` (what decodes: a model as its precision decodes it, model.decoding_copy, or an ensemble's members as
    one, decoding.ensemble) with its ``tokenizer`` and config ``cfg`` (its languages, casing and positions), decoding
    text in ``decode``'s settings (beam, n-best, length penalty, lengths, batch size) on ``device`` in ``precision``
    (what auto chose). ``from_checkpoint`` makes one from checkpoints, which it keeps as ``members``."""

    def __init__(
        self,
        model: Transformer | Ensemble,
        tokenizer: Tokenizer,
        cfg: Config,
        decode: DecodeConfig,
        device: torch.device,
        precision: str,
        members: Sequence[Loaded] = (),
    ) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.decode, self.device, self.precision = decode, device, precision
        self.members = list(members)
        self.max_positions = min(m.cfg.model.max_positions for m in members) if members else cfg.model.max_positions
        self.lowercase = cfg.data.lowercase  # trained on lowercased text: input is lowercased as it was
        self.warn = lambda msg: print(f"warning: {msg}", file=sys.stderr)
        self.targets = sorted({tgt for _, tgt in cfg.data.pairs()})
        if decode.to is not None:
            self.to(decode.to)  # a target the model has

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | Path | Loaded | Sequence[str | Path | Loaded], options: TranslateOptions
    ) -> Translator:
        """The one way to make a Translator from checkpoints: ``checkpoint`` a directory (loaded onto the device), one
        already in memory, or several decoding as an ensemble, under ``options``; what the decode settings given and
        the (first) checkpoint's say together is checked here, and an ensemble's members against each other
        (ensemble.check_members). The models are prepared for decoding now, once (auto picks the precision for the
        first one's shape); one model decodes alone, exactly as outside an ensemble."""
        device = options.device  # a torch device since __post_init__
        given = [checkpoint] if isinstance(checkpoint, (str, Path, Loaded)) else list(checkpoint)
        if not given:
            raise ConfigError("no checkpoint to translate with; give one (--checkpoint DIR) or several for an ensemble")
        members = [c if isinstance(c, Loaded) else load(c, device) for c in given]
        check_members(members)
        loaded = members[0]
        d = loaded.cfg.decode
        decode = replace(
            d,
            beam=d.beam if options.beam is None else options.beam,
            nbest=d.nbest if options.nbest is None else options.nbest,
            alpha=d.alpha if options.alpha is None else options.alpha,
            batch_tokens=d.batch_tokens if options.batch_tokens is None else options.batch_tokens,
            to=d.to if options.to is None else options.to,
        )
        check_decode(decode, loaded.tokenizer.vocab_size)  # the settings given against the checkpoint's and its model
        precision = decoding_precision(options.precision, loaded.model, device, lambda msg: print(msg, file=sys.stderr))
        models = [decoding_model(m.model, precision, device) for m in members]
        model = models[0] if len(models) == 1 else Ensemble(models)
        return cls(model, loaded.tokenizer, loaded.cfg, decode, device, precision, members)

    def alone(self) -> list[Translator]:
        """Each member of an ensemble decoding alone, in the same settings and precision, through the model the
        ensemble prepared for it (itself for one model)."""
        if not isinstance(self.model, Ensemble):
            return [self]
        made = zip(self.members, self.model.members)
        return [
            type(self)(model, m.tokenizer, m.cfg, self.decode, self.device, self.precision, [m]) for m, model in made
        ]

    @property
    def target(self) -> str | None:
        """The language translated into: ``decode.to``, else the model's only target language (None for a model of
        several when none was asked for)."""
        return self.decode.to or (self.targets[0] if len(self.targets) == 1 else None)

    @property
    def tag(self) -> int | None:
        """The id of the target's tag, which starts every source of a multilingual model; None for a model of one."""
        return self.tokenizer.tags[self.target] if self.cfg.data.tagged and self.target else None

    def to(self, language: str | None) -> Translator:
        """The same translator into ``language`` (None: the model's only target language); a language the model does
        not translate into, or None for a model of several, is refused naming its targets."""
        target_of(self.cfg, language)
        return self if language == self.decode.to else self.with_decode(replace(self.decode, to=language))

    def with_decode(self, decode: DecodeConfig) -> Translator:
        """The same model, tokenizer and device under other decode settings, checked where they came in (a server's
        request); the model is shared, not copied."""
        other = copy.copy(self)
        other.decode = decode
        return other

    def _ids(self, lines: list[str], first_line_no: int) -> list[list[int]]:
        """Token ids per line after the target's tag (a multilingual model's), truncated or refused when they and
        <END> exceed the model's positions."""
        if self.cfg.data.tagged:
            self._check_tags(lines, first_line_no)
        ids = self.tokenizer.encode_batch(lines) if lines else []
        tag = [] if self.tag is None else [self.tag]
        limit = self.max_positions - 1 - len(tag)
        for i, seq in enumerate(ids):
            if len(seq) > limit:
                where = f"line {first_line_no + i}: {len(seq)} tokens, the model has {self.max_positions} positions"
                if self.decode.too_long == "error":
                    raise TranslateError(f"{where}; shorten it or set decode.too_long=truncate")
                self.warn(f"{where}; truncated to {limit}")
                seq = seq[:limit]
            ids[i] = tag + seq if seq else seq  # an empty line stays empty: nothing to translate
        return ids

    def _check_tags(self, lines: list[str], first_line_no: int) -> None:
        """A multilingual model's input carries no tag typed by hand (tfm adds the target's), and has a target."""
        if self.target is None:
            raise TranslateError(f"the model translates into {', '.join(self.targets)}; say which with --to")
        for i, line in enumerate(lines):
            if match := TAG.match(line):
                raise TranslateError(
                    f"line {first_line_no + i} starts with the tag {match[0]}, which tfm adds itself; remove it from "
                    f"the text and give --to {match[1]}"
                )

    def _search(self, src: torch.Tensor, every_alpha: bool = False) -> list[list[Hypothesis]]:
        """The n-best of each sentence of src, or with ``every_alpha`` all that beam search finishes, unranked."""
        t = self.tokenizer
        d = self.decode
        with (
            autocast(self.precision, self.device),
            decoding_threads(self.device, src.size(0) * d.beam),
            shape_changing_attention(self.device),
        ):
            if d.beam == 1:
                greedy = greedy_search(self.model, src, t.start_id, t.end_id, d.max_len_a, d.max_len_b, d.alpha)
                return [[h] for h in greedy]
            if every_alpha:
                return beam_finished(self.model, src, t.start_id, t.end_id, d.beam, d.max_len_a, d.max_len_b)
            return beam_search(
                self.model,
                src,
                t.start_id,
                t.end_id,
                beam=d.beam,
                alpha=d.alpha,
                nbest=d.nbest,
                max_len_a=d.max_len_a,
                max_len_b=d.max_len_b,
            )

    def _hypotheses(
        self, lines: list[str], first_line_no: int, search: Callable[[torch.Tensor], list[list[Hypothesis]]]
    ) -> list[list[Hypothesis]]:
        """``search``'s hypotheses for each line, in input order; lines are batched by length."""
        ids = self._ids([source_line(line, self.lowercase) for line in lines], first_line_no)
        out: list[list[Hypothesis]] = [[] for _ in lines]
        for batch in sorted_batches([len(seq) for seq in ids], self.decode.batch_tokens):
            src = source_tensor([ids[i] for i in batch], self.tokenizer)
            for i, hs in zip(batch, search(src.to(self.device))):
                out[i] = hs
        return out

    def translate_chunk(self, lines: list[str], first_line_no: int = 1) -> list[Translation]:
        """Translate a list of lines, returning one Translation per line in the same order."""
        hyps = self._hypotheses(lines, first_line_no, self._search)
        texts = iter(self.tokenizer.decode_batch([h.tokens for hs in hyps for h in hs]))
        return [Translation([next(texts) for _ in hs], [h.score for h in hs]) for hs in hyps]

    def best_under(self, lines: list[str], alphas: Sequence[float]) -> list[list[str]]:
        """The 1-best translation of every line under each length penalty, [alpha][line], from one search: beam
        search finishes the same hypotheses whatever the penalty, which only ranks them (search.beam_finished)."""
        finished = self._hypotheses(lines, 1, lambda src: self._search(src, every_alpha=True))
        best = [[ranked(hs, alpha)[0].tokens if hs else [] for hs in finished] for alpha in alphas]
        return [self.tokenizer.decode_batch(tokens) for tokens in best]

    def translate(self, lines: Iterable[str], chunk: int = 1000) -> Iterator[Translation]:
        """Stream translations of ``lines`` in input order, holding at most ``chunk`` lines at a time."""
        it = iter(lines)
        line_no = 1
        while True:
            part = list(islice(it, chunk))
            if not part:
                return
            yield from self.translate_chunk(part, line_no)
            line_no += len(part)
