"""Shared fixtures: the shipped sample corpus, Multi30k (from TFM_MULTI30K) and a tokenizer trained on it,
a tiny finished training run and a tiny untrained checkpoint.

TFM_MULTI30K defaults to ``<repo>/../shared/data/multi30k`` and TFM_TATOEBA (the English-Chinese
folder holding cmn-eng.tsv.gz) to ``<repo>/../shared/data/tatoeba-cmn-eng``; a relative value is
taken from the repository root, and is made absolute so the library finds it from any working directory.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest
import torch
from disks import mount_tmpfs, unmount
from hypothesis import settings
from tiny import SAMPLE, run_trainer, tiny_config

from transformer import checkpoint
from transformer.config import DataConfig, TokenizerConfig
from transformer.model.transformer import Transformer
from transformer.text.corpus import Corpus, load_split
from transformer.text.tokenizer import Tokenizer, train_tokenizer
from transformer.training.trainer import Result

REPO = Path(__file__).resolve().parents[1]
os.environ["TFM_MULTI30K"] = str((REPO / os.environ.get("TFM_MULTI30K", "../shared/data/multi30k")).resolve())
os.environ["TFM_TATOEBA"] = str((REPO / os.environ.get("TFM_TATOEBA", "../shared/data/tatoeba-cmn-eng")).resolve())
# CI draws the same examples on every run, so that a submission's result is its own and not the draw's; a developer's
# run draws anew each time and keeps what failed in .hypothesis/ (found cases then become @example lines).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
# The suite runs tfm in subprocesses beside itself: a shared CPU, where spinning OpenMP threads wait on each other.
os.environ.setdefault("TFM_SHARED_CPU", "1")


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """One intra-op thread in the test process: the models here are too tiny for threads to pay, and on a
    busy machine a second thread makes each op wait on the other (subprocesses under test keep torch's default)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The Multi30k folder; tests that need it are skipped where it is absent."""
    path = Path(os.environ["TFM_MULTI30K"])
    if not (path / "train.de.gz").is_file():
        pytest.skip(f"Multi30k not found in {path}; set TFM_MULTI30K")
    return path


@pytest.fixture(scope="session")
def tatoeba() -> Path:
    """Tatoeba cmn-eng (English TAB Chinese, no header); tests that need it are skipped where it is absent."""
    path = Path(os.environ["TFM_TATOEBA"]) / "cmn-eng.tsv.gz"
    if not path.is_file():
        pytest.skip(f"Tatoeba cmn-eng not found at {path}; set TFM_TATOEBA to its folder")
    return path


@pytest.fixture(scope="session")
def small_multi30k(multi30k_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Multi30k's first 48 lines of every split and language: enough for a bench to train and score, in seconds
    (TFM_MULTI30K outranks --data-dir: a test that gives this folder to tfm unsets it). Read only."""
    folder = tmp_path_factory.mktemp("multi30k")
    for path in multi30k_dir.glob("*.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(48)]
        with gzip.open(folder / path.name, "wt", encoding="utf-8") as f:
            f.writelines(lines)
    return folder


@pytest.fixture(scope="session")
def multi30k_cfg(multi30k_dir: Path) -> DataConfig:
    return DataConfig(format="multi30k", path=str(multi30k_dir))


@pytest.fixture(scope="session")
def multi30k_train(multi30k_cfg: DataConfig) -> Corpus:
    return load_split(multi30k_cfg, multi30k_cfg.train_split)


@pytest.fixture(scope="session")
def multi30k_val(multi30k_cfg: DataConfig) -> Corpus:
    return load_split(multi30k_cfg, multi30k_cfg.valid_split)


@pytest.fixture(scope="session")
def multi30k_tokenizer(multi30k_train: Corpus) -> Tokenizer:
    """The default 8,000-token joint BPE trained on Multi30k train."""
    return train_tokenizer(TokenizerConfig(), multi30k_train)


@pytest.fixture(scope="session")
def sample_cfg() -> DataConfig:
    """The German-English sample corpus shipped in data/sample/."""
    return DataConfig(format="text", path=str(REPO / "data" / "sample"), valid_split="valid", test_split="valid")


@pytest.fixture(scope="session")
def sample_tokenizer(sample_cfg: DataConfig) -> Tokenizer:
    """A small BPE (1,000 tokens) trained on the sample corpus."""
    return train_tokenizer(TokenizerConfig(vocab_size=1000), load_split(sample_cfg, "train"))


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """A finished run of tiny.tiny_config (6 updates: step_3, step_6 and best). Tests may add files beside
    its checkpoints but must not change or remove any."""
    return run_trainer(tiny_config(tmp_path_factory.mktemp("tiny-run")))


@pytest.fixture(scope="session")
def tiny_tagged_run(tmp_path_factory: pytest.TempPathFactory) -> Result:
    """A finished run of tiny.tiny_config in both directions of the sample corpus, de-en and en-de: one model, each
    source tagged with its target (>>en<<, >>de<<). Read only."""
    cfg = tiny_config(tmp_path_factory.mktemp("tagged-run"), data={"directions": ["de-en", "en-de"]})
    return run_trainer(cfg)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained checkpoint of tiny.tiny_config's model with a tokenizer from data/sample: nonsense
    translations of 5 tokens at most. Read only."""
    folder = tmp_path_factory.mktemp("ckpt")
    cfg = tiny_config(folder, decode={"max_len_a": 0.0, "max_len_b": 5})
    texts = (SAMPLE / "train.de").read_text(encoding="utf-8").splitlines()
    texts += (SAMPLE / "train.en").read_text(encoding="utf-8").splitlines()
    tok = Tokenizer.train(texts, vocab_size=cfg.tokenizer.vocab_size)
    torch.manual_seed(0)
    return checkpoint.save(folder / "ck", cfg, tok, Transformer(cfg.model, tok.vocab_size, tok.pad_id), {"step": 0})


@pytest.fixture()
def small_disk(tmp_path):
    """A 600 KB tmpfs (as root where mounting is allowed), so that a write really runs out of space."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not mount_tmpfs(disk, "600k"):
        pytest.skip("cannot mount a small tmpfs here")
    yield disk
    unmount(disk)
