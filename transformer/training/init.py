"""Starting a run from a trained model (``train.init``, ``tfm train --init``): fine-tuning, domain adaptation, a
multilingual model narrowed to one direction.

The new run takes the checkpoint's weights, tokenizer and model shape, and nothing of its training: a fresh
optimizer and learning-rate schedule (with its own warm-up), its own data, directions and early stopping. A target
language the checkpoint's tokenizer has no tag for gets one, appended to the vocabulary, with embedding rows
initialised as a new model's (the byte-fallback BPE spells a language it never saw as bytes: it works, in more
tokens a sentence). The run records where it started (``train.init`` and the SHA-256 of its weights,
``train.init_fingerprint``) in its config, so in every checkpoint and export. What cannot continue is refused, naming
the conflict, before anything is written.
"""

from __future__ import annotations

import hashlib
from dataclasses import fields, replace
from pathlib import Path
from typing import Callable

import torch

from transformer import checkpoint
from transformer.config import Config, ModelConfig, TokenizerConfig
from transformer.errors import TrainError
from transformer.model.transformer import Transformer
from transformer.storage import manifest
from transformer.text.tokenizer import Tokenizer

# What a model's weights do not fix, and a run started from it may change.
FREE = ("dropout", "attention_dropout", "relu_dropout", "max_positions")
# Compared as the depths they give together: N 3 is encoder_layers 3 and decoder_layers 3.
DEPTHS = ("N", "encoder_layers", "decoder_layers")
_EMBEDDINGS = ("src_embed.weight", "tgt_embed.weight", "generator.weight")


def shape_conflicts(ours: ModelConfig, theirs: ModelConfig) -> list[tuple[str, object, object]]:
    """Each model setting (its name, ours, theirs) that differs between two shapes one model could not carry to the
    other, their depths aside (those are compared together, as ``ModelConfig.depths``)."""
    return [
        (f.name, getattr(ours, f.name), getattr(theirs, f.name))
        for f in fields(ModelConfig)
        if f.name not in FREE + DEPTHS and getattr(ours, f.name) != getattr(theirs, f.name)
    ]


def resolve(cfg: Config, log: Callable[[str], None]) -> Config:
    """``cfg`` with ``train.init`` the checkpoint to start from (a run folder gives its ``best/``, said so) and
    ``train.init_fingerprint`` its weights' SHA-256; refuses a checkpoint that the config cannot continue from (another
    shape, tokenizer or casing), naming the conflict."""
    if cfg.train.init is None:
        return cfg
    path = Path(cfg.train.init)
    if not (path / checkpoint.WEIGHTS).exists() and (path / "best" / checkpoint.META).is_file():
        log(f"--init {path} is a run folder: starting from its best checkpoint, {path / 'best'}")
        path = path / "best"
    checkpoint.check_files(path, checkpoint.CONFIG, checkpoint.TOKENIZER, checkpoint.WEIGHTS, checkpoint.META)
    parent = checkpoint.read_config(path)
    ours, theirs = cfg.model.depths, parent.model.depths
    layers = f"the model has {ours[0]} encoder and {ours[1]} decoder layers in the config and {theirs[0]} and "
    layers += f"{theirs[1]} there"
    differ = [layers] if ours != theirs else []
    differ += [f"model.{n} is {a} in the config and {b} there" for n, a, b in shape_conflicts(cfg.model, parent.model)]
    differ += [
        f"tokenizer.{f.name} is {getattr(cfg.tokenizer, f.name)} in the config and {getattr(parent.tokenizer, f.name)} "
        "there"
        for f in fields(TokenizerConfig)
        if f.name != "path" and getattr(cfg.tokenizer, f.name) != getattr(parent.tokenizer, f.name)
    ]
    if cfg.data.lowercase != parent.data.lowercase:
        differ.append(f"data.lowercase is {cfg.data.lowercase} in the config and {parent.data.lowercase} there")
    if parent.data.tagged and not cfg.data.tagged:
        differ.append(
            f"it translates with target tags ({', '.join(parent.data.directions or [])}) and the config "
            "names no data.directions; set them, e.g. [de-en]"
        )
    if differ:
        raise TrainError(
            f"--init {path}: {differ[0]}; a run starts from the checkpoint's shape: set the config to match it "
            "or leave --init out"
        )
    fingerprint = hashlib.sha256((path / checkpoint.WEIGHTS).read_bytes()).hexdigest()
    return replace(cfg, train=replace(cfg.train, init=str(path), init_fingerprint=fingerprint))


def carried(cfg: Config, resumed: Config) -> Config:
    """``cfg`` resuming a run whose config is ``resumed``: where that run started from stays recorded."""
    t = resumed.train
    return replace(cfg, train=replace(cfg.train, init=t.init, init_fingerprint=t.init_fingerprint))


def parent(cfg: Config, device: torch.device, log: Callable[[str], None]) -> checkpoint.Loaded:
    """The checkpoint ``cfg.train.init`` names, loaded, and the same weights that ``resolve`` fingerprinted."""
    path = Path(cfg.train.init or "")
    if hashlib.sha256((path / checkpoint.WEIGHTS).read_bytes()).hexdigest() != cfg.train.init_fingerprint:
        raise TrainError(
            f"--init {path}: its weights changed since this run recorded them (train.init_fingerprint); start the run "
            "again with --overwrite, or restore that checkpoint"
        )
    loaded = checkpoint.load(path, device)
    log(f"starting from {path} (weights {cfg.train.init_fingerprint[:12]}, step {loaded.meta.get('step', '?')})")
    return loaded


def tokenizer(loaded: checkpoint.Loaded, cfg: Config, main: bool) -> Tokenizer:
    """The checkpoint's tokenizer with a tag for every target language of a tagged run, saved in the run directory
    (by the main process)."""
    tok = loaded.tokenizer.with_tags(t for _, t in cfg.data.pairs()) if cfg.data.tagged else loaded.tokenizer
    tok = tok.with_specials([Tokenizer.BT] if cfg.data.synthetic is not None and cfg.data.synthetic_tag else [])
    if main:
        tok.save(cfg.out_dir / checkpoint.TOKENIZER)
        manifest.record(cfg.out_dir, checkpoint.TOKENIZER)
    return tok


def load_weights(model: Transformer, loaded: checkpoint.Loaded) -> None:
    """``loaded``'s weights into ``model``, a new model of the same shape over its vocabulary or a longer one (tags
    appended): the embedding rows it had are copied, the new rows keep their fresh initialisation."""
    weights = loaded.model.state_dict()
    own = model.state_dict()
    for key in _EMBEDDINGS:
        if key in weights and weights[key].size(0) < own[key].size(0):
            grown = own[key].clone()
            grown[: weights[key].size(0)] = weights[key]
            weights[key] = grown
    model.load_state_dict(weights)
