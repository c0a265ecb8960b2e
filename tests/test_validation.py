"""Validation: its loss is the label-smoothed loss of the whole logits, made without them, and BLEU sits beside it."""

import math

import torch
from tiny import tiny_config

from transformer.model.transformer import Transformer
from transformer.text.batching import collate, make_batches
from transformer.training import train_data
from transformer.training.loss import label_smoothed_nll
from transformer.training.validation import Validator


def test_loss_is_that_of_the_whole_logits_and_the_model_is_left_training(tmp_path):
    """Each module of the model stays in training mode: validation runs through a copy of its modules made once,
    over the model's own tensors, so a second validation sees the weights as they are then."""
    cfg = tiny_config(tmp_path, train={"label_smoothing": 0.1})
    cfg.out_dir.mkdir(parents=True)
    data = train_data.read_splits(cfg, cfg.out_dir, None, lambda msg: None)
    tokenizer, valid_enc = data.tokenizer, data.valid[0].encoded
    torch.manual_seed(0)
    model = Transformer(cfg.model, tokenizer.vocab_size, tokenizer.pad_id)
    validate = Validator(model, tokenizer, cfg, torch.device("cpu"), data.valid)
    with torch.no_grad():
        for p in model.parameters():  # trained further after the validator was made
            p.add_(0.01 * torch.randn_like(p))
    metrics = validate()
    assert all(m.training for m in model.modules())
    assert set(metrics) == {"valid_loss", "valid_nll", "valid_ppl", "valid_bleu", "valid_chrf"}
    model.eval()
    loss = nll = tokens = 0.0
    with torch.no_grad():
        for idx in make_batches(valid_enc, cfg.train.batch_tokens, cfg.seed, 0, shuffle=False):
            b = collate(valid_enc, idx, tokenizer)
            batch_loss, batch_nll = label_smoothed_nll(model(b.src, b.tgt_in), b.tgt_out, 0.1, tokenizer.pad_id)
            loss, nll, tokens = loss + float(batch_loss), nll + float(batch_nll), tokens + b.n_tokens
    assert math.isclose(metrics["valid_loss"], loss / tokens, rel_tol=1e-5)
    assert math.isclose(metrics["valid_nll"], nll / tokens, rel_tol=1e-5)
    assert math.isclose(metrics["valid_ppl"], math.exp(nll / tokens), rel_tol=1e-5)
