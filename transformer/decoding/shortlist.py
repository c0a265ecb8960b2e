"""A lexical shortlist (Marian's ``--shortlist``, CTranslate2's vocabulary map): the target tokens each source token
is likely to bring into a translation, so that a decoding step scores only the batch's candidates (a few hundred
for a sentence) instead of the whole vocabulary; the output layer is the largest matrix a small model multiplies at
every step.

It is counted from parallel text tokenized with the model's tokenizer: for each source token s, the ``per_token``
target tokens t with the highest p(t | s), the share of the pairs holding s whose target holds t, among tokens that
are not already kept for every sentence; kept for every sentence are the ``frequent`` most frequent target tokens
and the special ones. Tokens outside a batch's list get no probability, so its log-probabilities are renormalised
over the list: a translation (and its score) may differ from the whole vocabulary's where the list misses a token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save
from torch import nn

from transformer.errors import ConfigError, DataError
from transformer.storage.files import atomic_file
from transformer.text.tokenizer import Tokenizer


class Shortlist:
    """Per source token id, the target ids it brings (``table`` [V, per_token], -1 where it has fewer), and the ids
    every sentence keeps (``always``), for the tokenizer of ``fingerprint``."""

    def __init__(self, table: torch.Tensor, always: torch.Tensor, fingerprint: str) -> None:
        self.table, self.always, self.fingerprint = table, always, fingerprint

    @classmethod
    def count(
        cls, pairs: Iterable[tuple[Sequence[int], Sequence[int]]], tokenizer: Tokenizer, per_token: int, frequent: int
    ) -> Shortlist:
        """The shortlist of token-id ``pairs`` (source, target) for ``tokenizer``'s vocabulary."""
        v = tokenizer.vocab_size
        together = _PairCounts()
        target_counts = np.zeros(v, np.int64)
        for src, tgt in pairs:
            s, t = np.unique(np.asarray(src, np.int64)), np.unique(np.asarray(tgt, np.int64))
            target_counts[t] += 1
            together.add((s[:, None] * v + t[None, :]).ravel())
        specials = [tokenizer.pad_id, tokenizer.start_id, tokenizer.end_id, tokenizer.unk_id]
        ranked = np.argsort(-target_counts, kind="stable")
        always = np.union1d(ranked[: min(frequent, int((target_counts > 0).sum()))], specials)
        table = np.full((v, per_token), -1, np.int64)
        codes, counts = together.totals()
        s, t = codes // v, codes % v
        keep = ~np.isin(t, always)
        s, t, counts = s[keep], t[keep], counts[keep]
        order = np.lexsort((t, -counts, s))  # by source, then most often together: p(t | s) within a source
        s, t = s[order], t[order]
        rank = np.arange(len(s)) - np.searchsorted(s, s, side="left")
        chosen = rank < per_token
        table[s[chosen], rank[chosen]] = t[chosen]
        return cls(torch.from_numpy(table), torch.from_numpy(always.astype(np.int64)), tokenizer.fingerprint())

    def tokens(self, src: torch.Tensor, pad_id: int, also: Iterable[int] = ()) -> torch.Tensor:
        """The sorted target ids a batch of sources src [B, S] may be translated into (and ``also``'s)."""
        present = torch.unique(src[src != pad_id].cpu())
        listed = self.table[present].ravel()
        extra = torch.tensor(sorted(set(also)), dtype=torch.long)
        return torch.unique(torch.cat([listed[listed >= 0], self.always, extra])).to(src.device)

    def save(self, path: str | Path) -> None:
        """Write the shortlist to ``path`` (safetensors, atomically), with its tokenizer's fingerprint."""
        meta = {"tokenizer": self.fingerprint, "per_token": str(self.table.size(1)), "always": str(len(self.always))}
        data = save({"table": self.table.to(torch.int32), "always": self.always.to(torch.int32)}, metadata=meta)
        with atomic_file(path, "wb") as f:
            f.write(data)

    @classmethod
    def load(cls, path: str | Path, tokenizer: Tokenizer) -> Shortlist:
        """The shortlist at ``path``, made for ``tokenizer``; one made for another tokenizer, or not a shortlist, is
        refused in one line."""
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                table, always = f.get_tensor("table").long(), f.get_tensor("always").long()
        except FileNotFoundError:
            raise ConfigError(
                f"shortlist {path} does not exist; make one with tfm shortlist --checkpoint CKPT"
            ) from None
        except (OSError, SafetensorError) as e:
            raise DataError(f"shortlist {path} cannot be read ({e}); make it again with tfm shortlist") from None
        if meta.get("tokenizer") != tokenizer.fingerprint() or table.size(0) != tokenizer.vocab_size:
            raise ConfigError(
                f"shortlist {path} was made for another tokenizer than the model's; make one for this model with "
                "tfm shortlist --checkpoint CKPT"
            )
        return cls(table, always, meta["tokenizer"])


class Shortlisted(nn.Module):
    """``model`` (a Transformer or an Ensemble) as a search sees it, its steps giving the logits of the target ids
    ``vocab`` alone (``Shortlist.tokens`` of the batch, ascending), which the search maps its picks back through;
    the model itself is not changed."""

    def __init__(self, model: nn.Module, vocab: torch.Tensor) -> None:
        super().__init__()
        self.model, self.vocab, self.pad_id = model, vocab, model.pad_id
        self.training = model.training
        self.encode, self.decode_step = model.encode, model.decode_step  # the model's own: its state holds the vocab

    def start_state(self, memory: Any, src_keep: torch.Tensor) -> Any:
        """The model's fresh state, its steps scoring ``vocab`` alone."""
        return self.model.start_state(memory, src_keep, self.vocab)


class _PairCounts:
    """How many pairs hold each (source, target) token code, counted a block of codes at a time so that memory holds
    the distinct codes, not every occurrence."""

    BLOCK = 4_000_000

    def __init__(self) -> None:
        self.codes, self.counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
        self.pending: list[np.ndarray] = []
        self.size = 0

    def add(self, codes: np.ndarray) -> None:
        self.pending.append(codes)
        self.size += len(codes)
        if self.size >= self.BLOCK:
            self._merge()

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Each distinct code and its count, codes ascending."""
        self._merge()
        return self.codes, self.counts

    def _merge(self) -> None:
        if not self.pending:
            return
        block, n = np.unique(np.concatenate(self.pending), return_counts=True)
        codes, where = np.unique(np.concatenate([self.codes, block]), return_inverse=True)
        weights = np.concatenate([self.counts, n])
        self.counts = np.bincount(where, weights=weights, minlength=len(codes)).astype(np.int64)
        self.codes, self.pending, self.size = codes, [], 0
