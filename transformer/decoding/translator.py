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
from dataclasses import dataclass, fields, replace
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch

from transformer.checkpoint import Loaded, load
from transformer.config import Config, DecodeConfig, check_decode
from transformer.decoding.alignment import pharaoh
from transformer.decoding.ensemble import Ensemble, check_members
from transformer.decoding.forced import Scored, forced_scores
from transformer.decoding.search import (
    Hypothesis,
    Sample,
    beam_finished,
    beam_search,
    greedy_search,
    max_output_lengths,
    ranked,
    sample,
)
from transformer.decoding.shortlist import Shortlist, Shortlisted
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
class Batch:
    """A batch of sentences to decode: their source tensor, their line numbers (which seed sampling) and their
    forced prefixes (target token ids; None: none)."""

    src: torch.Tensor
    lines: list[int]
    prefixes: list[list[int]] | None = None


def _generator(seed: tuple[int, int, int]) -> torch.Generator:
    """A CPU generator of its own for one sample of one line: (the decode's seed, the line number, the sample's)."""
    return torch.Generator().manual_seed(hash(seed) & (2**63 - 1))


@dataclass
class Translation:
    """The n-best hypotheses of one input line, best first, as text and scores (and, when asked, each one's word
    alignment to the line: Pharaoh ``i-j`` pairs, source word i, target word j, from 0)."""

    texts: list[str]
    scores: list[float]
    alignments: list[str] | None = None

    @property
    def best(self) -> str:
        """The 1-best text ('' for an empty input)."""
        return self.texts[0] if self.texts else ""


class TranslateOptions:
    """How to translate, as a command or a caller asks: the device and precision to decode in (runtime.precision's
    names, or auto), and decode settings (``DecodeConfig``'s fields; None: not given) given over the checkpoint's.
    The device and the precision are checked as they come in: a device this machine has (kept as a torch device), a
    precision it decodes in there."""

    def __init__(self, device: str | torch.device = "auto", precision: str = "fp32", **decode: Any) -> None:
        if unknown := sorted(set(decode) - DECODE_FIELDS):
            raise TypeError(f"{unknown[0]!r} is not a decode setting; the settings are DecodeConfig's fields")
        self.device = resolve_device(str(device))
        self.precision = precision
        check_precision(precision, self.device, training=False)
        self.decode = {k: v for k, v in decode.items() if v is not None}

    def over(self, decode: DecodeConfig) -> DecodeConfig:
        """``decode`` with the settings given replacing its own; sampling draws one token a row, so it takes a beam of
        one unless a beam was given (which check_decode then refuses)."""
        sampling = {"beam": 1} if self.decode.get("sample") and "beam" not in self.decode else {}
        return replace(decode, **{**sampling, **self.decode})

    def get(self, name: str) -> Any:
        """A decode setting as given (None where it was not)."""
        return self.decode.get(name)


DECODE_FIELDS = {f.name for f in fields(DecodeConfig)}


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
        self.shortlist = Shortlist.load(decode.shortlist, tokenizer) if decode.shortlist else None

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
        decode = options.over(loaded.cfg.decode)
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

    def _search(self, batch: Batch, every_alpha: bool = False) -> list[list[Hypothesis]]:
        """The n-best of each sentence of the batch (or n samples, best first), or with ``every_alpha`` all that beam
        search finishes, unranked."""
        t, d, src = self.tokenizer, self.decode, batch.src
        model = self.model
        if self.shortlist is not None:  # and a forced prefix's tokens
            vocab = self.shortlist.tokens(src, t.pad_id, (i for p in batch.prefixes or [] for i in p))
            model = Shortlisted(self.model, vocab)
        with (
            autocast(self.precision, self.device),
            decoding_threads(self.device, src.size(0) * max(d.beam, d.nbest if d.sample else 1)),
            shape_changing_attention(self.device),
        ):
            limits = (t.start_id, t.end_id)
            if d.sample:  # each sample a row of its own, its draws seeded by its line and its number
                n = d.nbest
                seeds = [(d.seed, line, j) for line in batch.lines for j in range(n)]
                choice = Sample([_generator(s) for s in seeds], d.temperature, d.top_k, d.top_p)
                rows = src.repeat_interleave(n, 0)
                prefixes = [p for p in batch.prefixes for _ in range(n)] if batch.prefixes else None
                drawn = sample(model, rows, *limits, choice, d.alpha, d.max_len_a, d.max_len_b, prefixes)
                return [sorted(drawn[i : i + n], key=lambda h: -h.score) for i in range(0, len(drawn), n)]
            if d.beam == 1:
                greedy = greedy_search(model, src, *limits, d.max_len_a, d.max_len_b, d.alpha, batch.prefixes)
                return [[h] for h in greedy]
            if every_alpha:
                return beam_finished(model, src, *limits, d.beam, d.max_len_a, d.max_len_b, batch.prefixes)
            return beam_search(model, src, *limits, d.beam, d.alpha, d.nbest, d.max_len_a, d.max_len_b, batch.prefixes)

    def _hypotheses(
        self,
        lines: list[str],
        first_line_no: int,
        search: Callable[[Batch], list[list[Hypothesis]]],
        prefixes: Sequence[str] | None = None,
    ) -> tuple[list[list[int]], list[list[Hypothesis]]]:
        """Each line's source ids and ``search``'s hypotheses for it, in input order; lines are batched by length, and
        each hypothesis starts with its line's forced prefix (``prefixes``: target text, one a line) if given."""
        ids = self._ids([source_line(line, self.lowercase) for line in lines], first_line_no)
        forced = self._prefixes(ids, prefixes, first_line_no) if prefixes is not None else None
        out: list[list[Hypothesis]] = [[] for _ in lines]
        for batch in sorted_batches([len(seq) for seq in ids], self.decode.batch_tokens):
            src = source_tensor([ids[i] for i in batch], self.tokenizer).to(self.device)
            chosen = [forced[i] for i in batch] if forced is not None else None
            for i, hs in zip(batch, search(Batch(src, [first_line_no + i for i in batch], chosen))):
                out[i] = hs
        return ids, out

    def _prefixes(self, ids: list[list[int]], prefixes: Sequence[str], first_line_no: int) -> list[list[int]]:
        """Each line's forced prefix as target tokens; one longer than the line's output limit is refused."""
        forced = self.tokenizer.encode_batch([clean_line(p) for p in prefixes]) if prefixes else []
        d = self.decode
        for i, (seq, prefix) in enumerate(zip(ids, forced)):
            limit = int(max_output_lengths(torch.tensor([len(seq)]), d.max_len_a, d.max_len_b))
            if len(prefix) > limit:
                raise TranslateError(
                    f"line {first_line_no + i}: the prefix is {len(prefix)} tokens and the output may hold {limit} "
                    "(decode.max_len_a * source tokens + decode.max_len_b); shorten the prefix or raise max_len_b"
                )
        return forced

    def translate_chunk(
        self, lines: list[str], first_line_no: int = 1, prefixes: Sequence[str] | None = None, align: bool = False
    ) -> list[Translation]:
        """Translate a list of lines, returning one Translation per line in the same order; ``prefixes`` (one a line)
        forces how each translation starts; ``align`` adds each hypothesis's word alignment."""
        ids, hyps = self._hypotheses(lines, first_line_no, self._search, prefixes)
        texts = iter(self.tokenizer.decode_batch([h.tokens for hs in hyps for h in hs]))
        out = [Translation([next(texts) for _ in hs], [h.score for h in hs]) for hs in hyps]
        if align:
            links = iter(self._alignments([(ids[i], h.tokens) for i, hs in enumerate(hyps) for h in hs]))
            for translation, hs in zip(out, hyps):
                translation.alignments = [next(links) for _ in hs]
        return out

    def _alignments(self, pairs: list[tuple[list[int], list[int]]]) -> list[str]:
        """Pharaoh alignments of (source ids, hypothesis tokens) pairs, read from the (first) model's encoder-decoder
        attention of layer ``decode.align_layer`` (decoding.alignment)."""
        model = self.model.members[0] if isinstance(self.model, Ensemble) else self.model
        skip = 0 if self.tag is None else 1
        with autocast(self.precision, self.device):
            return [pharaoh(model, self.tokenizer, s, t, self.decode.align_layer, skip) for s, t in pairs]

    def score(self, sources: list[str], targets: list[str], first_line_no: int = 1) -> list[Scored]:
        """Each (source, target) pair's scores under the model (decoding.forced), in order; an empty target, or one
        that with its <END> exceeds the model's positions, is refused naming its line."""
        ids = self._ids([source_line(line, self.lowercase) for line in sources], first_line_no)
        wanted = self.tokenizer.encode_batch([clean_line(t) for t in targets])
        for i, (src, tgt) in enumerate(zip(ids, wanted)):
            where = f"line {first_line_no + i}"
            if not tgt:
                raise TranslateError(f"{where}: the target is empty; give each source line its translation to score")
            if not src:
                raise TranslateError(f"{where}: the source is empty; give each target line its source to score")
            if len(tgt) + 1 > self.max_positions:
                raise TranslateError(
                    f"{where}: the target is {len(tgt)} tokens and the model has {self.max_positions} positions; "
                    "shorten it"
                )
        out: list[Scored | None] = [None] * len(ids)
        t, d = self.tokenizer, self.decode
        for batch in sorted_batches([len(seq) for seq in ids], d.batch_tokens):
            src = source_tensor([ids[i] for i in batch], t).to(self.device)
            with autocast(self.precision, self.device), shape_changing_attention(self.device):
                scored = forced_scores(self.model, src, [wanted[i] for i in batch], t.start_id, t.end_id, d.alpha)
            for i, s in zip(batch, scored):
                out[i] = s
        return out  # type: ignore[return-value]

    def best_under(self, lines: list[str], alphas: Sequence[float]) -> list[list[str]]:
        """The 1-best translation of every line under each length penalty, [alpha][line], from one search: beam
        search finishes the same hypotheses whatever the penalty, which only ranks them (search.beam_finished)."""
        _, finished = self._hypotheses(lines, 1, lambda batch: self._search(batch, every_alpha=True))
        best = [[ranked(hs, alpha)[0].tokens if hs else [] for hs in finished] for alpha in alphas]
        return [self.tokenizer.decode_batch(tokens) for tokens in best]

    def translate(
        self,
        lines: Iterable[str],
        chunk: int = 1000,
        prefixes: Iterable[str] | None = None,
        align: bool = False,
    ) -> Iterator[Translation]:
        """Stream translations of ``lines`` in input order, holding at most ``chunk`` lines at a time; ``prefixes`` as
        many as the lines (one a line), ``align`` as for translate_chunk."""
        it, forced = iter(lines), iter(prefixes) if prefixes is not None else None
        line_no = 1
        while True:
            part = list(islice(it, chunk))
            if not part:
                return
            starts = list(islice(forced, len(part))) if forced is not None else None
            if starts is not None and len(starts) != len(part):
                raise TranslateError(f"the prefixes end at line {line_no + len(starts) - 1}; give one for every line")
            yield from self.translate_chunk(part, line_no, starts, align)
            line_no += len(part)
