"""Validation during training: teacher-forced loss and perplexity on the valid split, greedy BLEU and chrF.

Loss and perplexity use every valid pair (of every direction), scored as training scores them (``generator_loss``: the
[tokens, V] logits are never whole, which at WMT's batch and vocabulary sizes would be gigabytes).
BLEU and chrF translate only the first ``train.eval_sentences`` sources (of each direction), so that validation
stays a small part of a run.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import torch

from transformer.config import Config
from transformer.decoding.translator import Translator
from transformer.model.decoding_copy import precision_copy
from transformer.model.speed import training_attention
from transformer.model.transformer import Transformer
from transformer.runtime.precision import autocast
from transformer.scoring import score
from transformer.text.batching import collate, make_batches
from transformer.text.tokenizer import Tokenizer
from transformer.training.loss import generator_loss
from transformer.training.train_data import Split


class Validator:
    """Validation of one run's ``model``, which goes on training between validations, on each direction's valid
    split (``valid``).

    It runs through a copy of the model's modules made once, in eval mode, over the model's own tensors
    (model.decoding_copy.precision_copy in fp32): every validation sees the weights as they are, the model's own modules
    stay in training mode, and no weights are copied. BLEU is greedy, in the run's precision (autocast); with several
    directions, each direction's BLEU and chrF are logged and ``valid_bleu`` is their mean (what ``best/`` is chosen
    on)."""

    def __init__(
        self, model: Transformer, tokenizer: Tokenizer, cfg: Config, device: torch.device, valid: list[Split]
    ) -> None:
        self.model = precision_copy(model, "fp32")
        self.tokenizer, self.cfg, self.device, self.valid = tokenizer, cfg, device, valid
        greedy = Translator(self.model, tokenizer, cfg, replace(cfg.decode, beam=1, nbest=1), device, cfg.precision)
        self.translators = [greedy.to(split.tgt_lang) for split in valid]

    def __call__(self) -> dict[str, float]:
        """Validation loss, perplexity, greedy BLEU and chrF of the model as it is now."""
        cfg, tokenizer, model = self.cfg, self.tokenizer, self.model
        loss_sum = nll_sum = 0.0
        tokens = 0
        with torch.inference_mode():
            for encoded in (split.encoded for split in self.valid):
                for idx in make_batches(encoded, cfg.train.batch_tokens, cfg.seed, 0, shuffle=False):
                    b = collate(encoded, idx, tokenizer).to(self.device)
                    with autocast(cfg.precision, self.device), training_attention(self.device, b.longest):
                        hidden = model(b.src, b.tgt_in, logits=False)
                        loss, nll = generator_loss(
                            hidden, model.generator.weight, b.tgt_out, cfg.train.label_smoothing, tokenizer.pad_id
                        )
                    loss_sum += float(loss)
                    nll_sum += float(nll)
                    tokens += b.n_tokens
        nll = nll_sum / max(tokens, 1)
        metrics = {"valid_loss": loss_sum / max(tokens, 1), "valid_nll": nll, "valid_ppl": math.exp(min(nll, 50.0))}
        n, each = cfg.train.eval_sentences, {}
        for split, translator in zip(self.valid, self.translators):
            hyps = [t.best for t in translator.translate(list(split.corpus.src[:n]))]
            each[split.name] = score(hyps, list(split.corpus.tgt[:n]), split.tgt_lang, cfg.decode.bleu_tokenize)
        metrics["valid_bleu"] = statistics.fmean(s.bleu for s in each.values())
        metrics["valid_chrf"] = statistics.fmean(s.chrf for s in each.values())
        if len(each) > 1:
            for name, s in each.items():
                metrics |= {f"valid_bleu_{name}": s.bleu, f"valid_chrf_{name}": s.chrf}
        return metrics
