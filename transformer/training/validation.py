"""Validation during training: teacher-forced loss and perplexity on the valid split, greedy BLEU and chrF.

Loss and perplexity use every valid pair, scored as training scores them (``generator_loss``: the
[tokens, V] logits are never whole, which at WMT's batch and vocabulary sizes would be gigabytes).
BLEU and chrF translate only the first ``train.eval_sentences`` sources, so that validation stays a
small part of a run.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from transformer.config import Config
from transformer.decoding.translator import Translator
from transformer.model.decoding_copy import precision_copy
from transformer.model.speed import training_attention
from transformer.model.transformer import Transformer
from transformer.runtime.precision import autocast
from transformer.scoring import score
from transformer.text.batching import EncodedCorpus, collate, make_batches
from transformer.text.corpus import Corpus
from transformer.text.tokenizer import Tokenizer
from transformer.training.loss import generator_loss


class Validator:
    """Validation of one run's ``model``, which goes on training between validations.

    It runs through a copy of the model's modules made once, in eval mode, over the model's own tensors
    (model.decoding_copy.precision_copy in fp32): every validation sees the weights as they are, the model's own modules
    stay in training mode, and no weights are copied. BLEU is greedy, in the run's precision (autocast)."""

    def __init__(
        self,
        model: Transformer,
        tokenizer: Tokenizer,
        cfg: Config,
        device: torch.device,
        valid: Corpus,
        valid_enc: EncodedCorpus,
    ) -> None:
        self.model = precision_copy(model, "fp32")
        self.tokenizer, self.cfg, self.device = tokenizer, cfg, device
        self.valid, self.valid_enc = valid, valid_enc
        greedy = replace(cfg.decode, beam=1, nbest=1)
        self.translator = Translator(self.model, tokenizer, cfg, greedy, device, cfg.precision)

    def __call__(self) -> dict[str, float]:
        """Validation loss, perplexity, greedy BLEU and chrF of the model as it is now."""
        cfg, tokenizer, model = self.cfg, self.tokenizer, self.model
        loss_sum = nll_sum = 0.0
        tokens = 0
        with torch.inference_mode():
            for idx in make_batches(self.valid_enc, cfg.train.batch_tokens, cfg.seed, 0, shuffle=False):
                b = collate(self.valid_enc, idx, tokenizer).to(self.device)
                with autocast(cfg.precision, self.device), training_attention(self.device, b.longest):
                    hidden = model(b.src, b.tgt_in, logits=False)
                    loss, nll = generator_loss(
                        hidden, model.generator.weight, b.tgt_out, cfg.train.label_smoothing, tokenizer.pad_id
                    )
                loss_sum += float(loss)
                nll_sum += float(nll)
                tokens += b.n_tokens
        n = cfg.train.eval_sentences
        hyps = [t.best for t in self.translator.translate(list(self.valid.src[:n]))]
        scores = score(hyps, list(self.valid.tgt[:n]), cfg.data.tgt_lang, cfg.decode.bleu_tokenize)
        nll = nll_sum / max(tokens, 1)
        return {
            "valid_loss": loss_sum / max(tokens, 1),
            "valid_nll": nll,
            "valid_ppl": math.exp(min(nll, 50.0)),
            "valid_bleu": scores.bleu,
            "valid_chrf": scores.chrf,
        }
