"""Typed configuration: the dataclasses, the range of every number, and the checks a config must pass.

Every number a user might change lives here; defaults reproduce the paper's base model. A problem with a config is a
one-line ``ConfigError`` naming the key and the fix (exit code 2). Reading YAML and ``--set``: transformer.config_file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer.errors import ConfigError


def one_of(default: str, *others: str) -> Any:
    """A field that takes ``default`` or one of ``others``: the choices are declared here, beside the field, and
    ``validate`` checks every field declared so."""
    return field(default=default, metadata={"choices": (default, *others)})


@dataclass
class ModelConfig:
    """Architecture; names follow the paper (N, d_model, d_ff, h)."""

    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    dropout: float = 0.1
    norm_first: bool = False
    tie_embeddings: bool = True
    max_positions: int = 1024
    attention_dropout: float = 0.0  # on attention probabilities (Tensor2Tensor's; not in the paper)
    relu_dropout: float = 0.0  # on the feed-forward network's ReLU output (Tensor2Tensor's; not in the paper)
    encoder_layers: int | None = None  # the encoder's depth where it differs from N (a student: deep encoder)
    decoder_layers: int | None = None  # the decoder's depth where it differs from N (a student: shallow decoder)

    @property
    def depths(self) -> tuple[int, int]:
        """The encoder's and the decoder's layers: ``encoder_layers`` and ``decoder_layers``, else N for both."""
        return self.encoder_layers or self.N, self.decoder_layers or self.N


@dataclass
class DataConfig:
    """Where the corpus comes from and which languages and splits to use."""

    format: str = one_of("multi30k", "text", "tsv", "jsonl", "hf")
    path: str = "data/multi30k"
    src_lang: str = "de"
    tgt_lang: str = "en"
    train_split: str = "train"
    valid_split: str = "val"
    test_split: str = "test_2016_flickr"
    hf_config: str | None = None
    hf_field: str | None = None
    tsv_columns: list[str] | None = None  # languages of a header-less TSV's columns, e.g. [en, zh]
    holdout: list[int] | None = None
    split_seed: int = 1
    max_len: int = 100
    lowercase: bool = False
    # several directions in one model, e.g. [de-en, fr-en]: each source starts with its target's tag (>>en<<);
    # null: the one pair src_lang -> tgt_lang, untagged
    directions: list[str] | None = None
    temperature: float = 1.0  # each direction drawn in proportion to (its pairs) ** (1 / temperature) an epoch
    # a folder of synthetic pairs ({train_split}.{src_lang}, .{tgt_lang}; back-translations) trained on beside the
    # real ones, their sources tagged <BT> unless synthetic_tag is false
    synthetic: str | None = None
    synthetic_tag: bool = True

    def pairs(self) -> list[tuple[str, str]]:
        """The (source, target) languages the run trains: ``directions``, else the one pair."""
        if self.directions is None:
            return [(self.src_lang, self.tgt_lang)]
        return [tuple(d.split("-", 1)) for d in self.directions]  # type: ignore[misc]

    @property
    def tagged(self) -> bool:
        """Whether each source carries its target's tag (a model of ``directions``)."""
        return self.directions is not None


@dataclass
class TokenizerConfig:
    """Byte-fallback BPE from Hugging Face ``tokenizers``."""

    vocab_size: int = 8000
    joint: bool = True
    train_sample: int = 1_000_000
    min_frequency: int = 2
    path: str | None = None  # a tokenizer.json to take as it is instead of training one (a student takes its teacher's)


@dataclass
class TrainConfig:
    """Optimisation, schedule, validation and checkpointing."""

    batch_tokens: int = 4096
    accumulate: int = 1
    pad_multiple: int = 1
    label_smoothing: float = 0.1
    lr_factor: float = 1.0
    peak_lr: float | None = None
    warmup: int = 4000
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-9
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    max_steps: int = 100_000
    max_epochs: int = 1000
    max_minutes: float | None = None
    eval_every: int = 1000
    eval_sentences: int = 500
    save_every: int = 1000
    keep_last: int = 5
    patience: int = 10
    max_bad_steps: int = 20
    log_every: int = 50
    static_shapes: bool = False  # batches padded to batch_tokens // max(S, T) rows: shapes repeat (for CUDA graphs)
    compile: bool = False  # torch.compile the model's forward and backward in training (CUDA only)
    cuda_graphs: bool = False  # replay each batch shape's forward and backward as a CUDA graph (needs static_shapes)
    prefetch: int = 0  # updates collated ahead in a background thread (0: none)
    tensorboard: bool | None = None  # TensorBoard events beside log.jsonl (null: if tensorboard is installed)
    init: str | None = None  # a checkpoint whose weights, tokenizer and shape the run starts from (tfm train --init)
    init_fingerprint: str | None = None  # what tfm train recorded of init's weights (SHA-256), as the run began


@dataclass
class DecodeConfig:
    """The settings a decode takes, in one place: the config's ``decode`` section, which a command's flags or a
    request's keys replace for one decode (serving.checks.REQUEST names those a request may set). Search (beam, or
    sampling), n-best, length penalty and limits, batch size, the target language, what alignments read and a lexical
    shortlist."""

    beam: int = 4
    nbest: int = 1  # hypotheses returned per sentence: at most the beam, or that many samples
    alpha: float = 0.6
    max_len_a: float = 1.0
    max_len_b: int = 50
    batch_tokens: int = 4096
    too_long: str = one_of("truncate", "error")
    bleu_tokenize: str | None = None
    to: str | None = None  # the language to translate into, for a model of several (null: the model's only one)
    sample: bool = False  # draw each next token from the model's distribution instead of searching
    temperature: float = 1.0  # sampling: the logits divided by it (below 1 sharper, above flatter)
    top_k: int = 0  # sampling: from the k most probable tokens only (0: all)
    top_p: float = 1.0  # sampling: from the smallest set of tokens holding this much probability
    seed: int = 1  # sampling: with the line number, seeds each sentence's draws (the same whatever the batch)
    align_layer: int = -1  # alignments: the decoder layer whose encoder-decoder attention they read (-1: the last)
    shortlist: str | None = None  # a file of tfm shortlist: each step scores the tokens it lists for the source


@dataclass
class DistillConfig:
    """Sequence-level knowledge distillation (tfm distill, Kim and Rush 2016): the teachers whose translations of the
    training sources a student learns from, and how they translate."""

    teachers: list[str] = field(default_factory=list)  # checkpoints; several decode as an ensemble
    beam: int | None = None  # the teachers' beam (null: the first teacher's decode.beam)
    alpha: float | None = None  # their length penalty (null: the first teacher's decode.alpha)
    with_real: bool = False  # train on the real pairs as well, beside the distilled ones
    piece_lines: int = 1000  # lines translated and written at a time: a killed run goes on from the last piece
    from_teacher: bool = False  # the student starts from the first teacher's embeddings and evenly spaced layers


@dataclass
class Config:
    """A whole run: its name, where it goes, and every section above."""

    name: str = "run"
    run_dir: str = "runs"
    seed: int = 1
    device: str = "auto"
    precision: str = "fp32"  # a name runtime.precision knows (fp32, bf16, fp16, auto), checked as a run starts
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)

    @property
    def out_dir(self) -> Path:
        """The run directory, ``run_dir/name``."""
        return Path(self.run_dir) / self.name


DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?|mps")  # what device accepts, in a config file as on the command line


def _shown(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _span(low: float, high: float, note: str = "") -> tuple[Any, str]:
    """A range from ``low`` to ``high``, both included."""
    return (lambda v: low <= v <= high), f"{_shown(low)} to {_shown(high)}{note}"


def _above(low: float, high: float, note: str = "") -> tuple[Any, str]:
    """A range above ``low``, up to ``high`` included."""
    return (lambda v: low < v <= high), f"above {_shown(low)} and at most {_shown(high)}{note}"


_DROPOUT = ((lambda v: 0.0 <= v < 1.0), "in [0, 1)")
_SEED, _COUNT, _BIG = 2**32 - 1, 10**9, 10**12

# The range of every number a user can set, in a config file or (for decode values) on the command line: one table.
# Each is finite, wide enough for any real run and narrow enough that nothing downstream overflows.
RANGES: dict[str, tuple[Any, str]] = {
    "seed": _span(0, _SEED),
    "model.N": _span(1, 1000),
    "model.encoder_layers": _span(1, 1000, " (or null: N)"),
    "model.decoder_layers": _span(1, 1000, " (or null: N)"),
    "model.d_model": _span(1, 65_536),
    "model.d_ff": _span(1, 1_048_576),
    "model.h": _span(1, 4096),
    "model.dropout": _DROPOUT,
    "model.attention_dropout": _DROPOUT,
    "model.relu_dropout": _DROPOUT,
    "model.max_positions": _span(8, 1_048_576),
    "data.max_len": _span(1, 1_048_576),
    "data.split_seed": _span(0, _SEED),
    "data.temperature": _span(0.1, 1000, " (1: in proportion to each direction's pairs)"),
    "tokenizer.vocab_size": _span(300, 1_048_576, " (256 bytes + specials at least)"),
    "tokenizer.train_sample": _span(1, _BIG),
    "tokenizer.min_frequency": _span(1, _BIG),
    "train.batch_tokens": _span(1, _COUNT),
    "train.accumulate": _span(1, 100_000),
    "train.pad_multiple": _span(1, 4096),
    "train.label_smoothing": _DROPOUT,
    "train.lr_factor": _above(0, 1000),
    "train.peak_lr": _above(0, 10, " (or null: the paper's schedule)"),
    "train.max_minutes": _above(0, 10**7, " (or null: no time limit)"),
    "train.eval_sentences": _span(1, _COUNT),
    "train.warmup": _span(1, _BIG),
    "train.eps": _above(0, 1),
    "train.clip_norm": _span(0, 10**6, " (0: off)"),
    "train.weight_decay": _span(0, 10),
    "train.max_steps": _span(1, _BIG),
    "train.max_epochs": _span(1, _COUNT),
    "train.eval_every": _span(1, _BIG),
    "train.save_every": _span(1, _BIG),
    "train.keep_last": _span(1, 10**6),
    "train.patience": _span(1, _COUNT),
    "train.max_bad_steps": _span(1, _COUNT),
    "train.log_every": _span(1, _BIG),
    "train.prefetch": _span(0, 64, " (0: off)"),
    "distill.beam": _span(1, 1000, " (or null: the teacher's)"),
    "distill.alpha": _span(0, 10, " (or null: the teacher's)"),
    "distill.piece_lines": _span(1, 10**6),
    "decode.beam": _span(1, 1000),
    "decode.nbest": _span(1, 1000),
    "decode.alpha": _span(0, 10),
    "decode.max_len_a": _span(0, 1000),
    "decode.max_len_b": _span(0, 1_048_576),
    "decode.batch_tokens": _span(1, _COUNT),
    "decode.temperature": _above(0, 1000),
    "decode.top_k": _span(0, 1_048_576, " (0: off)"),
    "decode.top_p": _above(0, 1),
    "decode.seed": _span(0, _SEED),
    "decode.align_layer": _span(-1000, 1000, " (-1: the last)"),
}


_PLAIN_NAME = re.compile(r"[\w.-]+")


def out_of_range(key: str, value: Any) -> str | None:
    """What ``key`` must be, if ``value`` is outside its range in RANGES (NaN and infinity always are); else None."""
    ok, want = RANGES[key]
    if value is None or (ok(value) and not (isinstance(value, float) and not math.isfinite(value))):
        return None
    return want


def _get(cfg: Config, dotted: str) -> Any:
    obj: Any = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def brief(value: Any, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters: an error line stays one short line whatever a value holds."""
    shown = repr(value)
    return shown if len(shown) <= width else f"{shown[: width - 3]}..."


def _check_choices(obj: Any, prefix: str) -> None:
    """Every field declared with ``one_of`` holds one of its choices, in ``obj`` and its sections."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_choices(value, f"{prefix}{f.name}.")
        elif "choices" in f.metadata and value not in f.metadata["choices"]:
            raise ConfigError(f"{prefix}{f.name}: '{value}' is not one of {', '.join(f.metadata['choices'])}")


def validate(cfg: Config) -> Config:
    """Check choices, ranges and combinations that no single type can express."""
    _check_choices(cfg, "")
    if not DEVICE.fullmatch(cfg.device):
        raise ConfigError(f"device: '{cfg.device}' is not one of auto, cpu, cuda, cuda:N, mps")
    for key in RANGES:
        value = _get(cfg, key)
        if (want := out_of_range(key, value)) is not None:
            raise ConfigError(f"{key}: {brief(value)} is out of range; it must be {want}")
    if not _PLAIN_NAME.fullmatch(cfg.name) or cfg.name in (".", ".."):
        raise ConfigError(
            f"name: '{cfg.name}' must be a plain name (letters, digits, '.', '_', '-'): the run goes to "
            "run_dir/name; choose the folder with run_dir"
        )
    if cfg.train.cuda_graphs and not cfg.train.static_shapes:
        raise ConfigError("train.cuda_graphs needs train.static_shapes: true (a graph replays one shape); set both")
    m = cfg.model
    if m.d_model % m.h:
        raise ConfigError(f"model.d_model ({m.d_model}) must be divisible by model.h ({m.h}); change one of them")
    if (m.d_model // m.h) % 2:
        raise ConfigError(f"model.d_model / model.h must be even for the attention heads; got {m.d_model // m.h}")
    if m.d_model % 2:
        raise ConfigError(f"model.d_model ({m.d_model}) must be even for sinusoidal positions")
    if cfg.data.max_len + 1 > m.max_positions:
        raise ConfigError(
            f"data.max_len ({cfg.data.max_len}) + 1 exceeds model.max_positions ({m.max_positions}); "
            "lower data.max_len or raise model.max_positions"
        )
    if cfg.data.src_lang == cfg.data.tgt_lang:
        raise ConfigError(f"data.src_lang and data.tgt_lang are both '{cfg.data.src_lang}'; pick two languages")
    _check_directions(cfg.data.directions)
    if cfg.data.synthetic is not None and cfg.data.tagged:
        raise ConfigError(
            "data.synthetic adds pairs to one language pair and data.directions names several; use one of them"
        )
    if m.tie_embeddings and not cfg.tokenizer.joint:
        raise ConfigError("model.tie_embeddings needs tokenizer.joint: true; set one of them to the other's value")
    cols, langs = cfg.data.tsv_columns, sorted({lang for pair in cfg.data.pairs() for lang in pair})
    if cols is not None and (len(set(cols)) != len(cols) or set(langs) - set(cols)):
        raise ConfigError(
            f"data.tsv_columns {cols} must name each column once, including the languages trained "
            f"({', '.join(langs)}), e.g. [en, zh]"
        )
    if cfg.data.holdout is not None and (
        len(cfg.data.holdout) != 2 or not all(1 <= n <= _COUNT for n in cfg.data.holdout)
    ):
        raise ConfigError(f"data.holdout must be [valid_size, test_size], both 1 to {_COUNT:,}")
    check_decode(cfg.decode)
    if len(cfg.train.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.train.betas):
        raise ConfigError(f"train.betas must be two numbers in [0, 1), got {cfg.train.betas}")
    return cfg


_DIRECTION = re.compile(r"([A-Za-z][A-Za-z0-9_]{0,15})-([A-Za-z][A-Za-z0-9_]{0,15})")


def _check_directions(directions: list[str] | None) -> None:
    """Directions written source-target (de-en), each once, between two different languages."""
    if directions is None:
        return
    if not directions:
        raise ConfigError("data.directions is empty; name at least one, e.g. [de-en], or remove the key")
    for d in directions:
        match = _DIRECTION.fullmatch(d)
        if match is None:
            raise ConfigError(f"data.directions: {brief(d)} is not source-target, e.g. de-en; write each so")
        if match[1] == match[2]:
            raise ConfigError(f"data.directions: {d} translates {match[1]} into itself; pick two languages")
    if len(set(directions)) != len(directions):
        twice = next(d for d in directions if directions.count(d) > 1)
        raise ConfigError(f"data.directions names {twice} twice; name each direction once")


def check_decode(decode: DecodeConfig, vocab_size: int | None = None) -> DecodeConfig:
    """What the decode settings' types cannot say: no more n-best than the beam holds (sampling draws as many as
    asked), sampling without a beam, no wider a beam nor top-k than the model's vocabulary (when it is known)."""
    if decode.sample and decode.beam > 1:
        raise ConfigError(
            f"sampling draws tokens and a beam of {decode.beam} searches them; give one of them (--sample, or --beam)"
        )
    if decode.sample and vocab_size is not None and decode.top_k > vocab_size:
        raise ConfigError(
            f"top-k {decode.top_k} is larger than the model's vocabulary ({vocab_size:,} tokens); use at most "
            f"{vocab_size} (--top-k, or decode.top_k in a config)"
        )
    if decode.nbest > decode.beam and not decode.sample:
        raise ConfigError(
            f"nbest {decode.nbest} is larger than the beam {decode.beam}; ask for at most {decode.beam} "
            "(--nbest, or decode.nbest in a config)"
        )
    if vocab_size is not None and decode.beam > vocab_size:
        raise ConfigError(
            f"beam {decode.beam} is larger than the model's vocabulary ({vocab_size:,} tokens); use at most "
            f"{vocab_size} (--beam, or decode.beam in a config)"
        )
    return decode
