"""Validation during training: teacher-forced loss and perplexity on the valid split, greedy BLEU and chrF.

Loss and perplexity use every valid pair, scored as training scores them (``generator_loss``: the
[tokens, V] logits are never whole, which at WMT's batch and vocabulary sizes would be gigabytes).
BLEU and chrF translate only the first ``train.eval_sentences`` sources, so that validation stays a
small part of a run.
"""

from __future__ import annotations

import math

import torch

from transformer.checkpoint import Loaded
from transformer.config import Config
from transformer.decoding.translator import TranslateOptions, Translator
from transformer.model.speed import training_attention
from transformer.model.transformer import Transformer
from transformer.precision import autocast
from transformer.scoring import score
from transformer.text.batching import EncodedCorpus, collate, make_batches
from transformer.text.corpus import Corpus
from transformer.text.tokenizer import Tokenizer
from transformer.training.loss import generator_loss


def valid_metrics(
    model: Transformer, tokenizer: Tokenizer, cfg: Config, device: torch.device, valid: Corpus, valid_enc: EncodedCorpus
) -> dict[str, float]:
    """Validation loss, perplexity, greedy BLEU and chrF; the model is left in training mode."""
    model.eval()
    loss_sum = nll_sum = 0.0
    tokens = 0
    with torch.inference_mode():
        for idx in make_batches(valid_enc, cfg.train.batch_tokens, cfg.seed, 0, shuffle=False):
            b = collate(valid_enc, idx, tokenizer).to(device)
            with autocast(cfg.precision, device), training_attention(device, b.longest):
                hidden = model(b.src, b.tgt_in, logits=False)
                loss, nll = generator_loss(
                    hidden, model.generator.weight, b.tgt_out, cfg.train.label_smoothing, tokenizer.pad_id
                )
            loss_sum += float(loss)
            nll_sum += float(nll)
            tokens += b.n_tokens
    n = cfg.train.eval_sentences
    src, refs = list(valid.src[:n]), list(valid.tgt[:n])
    run = Loaded(cfg, tokenizer, model, {}, cfg.out_dir)  # the run's model as a checkpoint would hold it
    options = TranslateOptions(str(device), cfg.precision, beam=1, nbest=1)
    translator = Translator.from_checkpoint(run, options)
    hyps = [t.best for t in translator.translate(src)]
    scores = score(hyps, refs, cfg.data.tgt_lang, cfg.decode.bleu_tokenize)
    model.train()
    nll = nll_sum / max(tokens, 1)
    return {
        "valid_loss": loss_sum / max(tokens, 1),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 50.0)),
        "valid_bleu": scores.bleu,
        "valid_chrf": scores.chrf,
    }
