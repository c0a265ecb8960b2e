from transformer.errors import ConfigError
"""Config loading, validation and overrides: every bad value is one clear ConfigError."""

from pathlib import Path

import pytest

from transformer import config

CONFIGS = sorted(Path(__file__).resolve().parent.parent.joinpath("configs").glob("*.yaml"))


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def test_defaults_are_the_papers_base_model():
    m = config.Config().model
    assert (m.N, m.d_model, m.d_ff, m.h, m.dropout, m.norm_first) == (6, 512, 2048, 8, 0.1, False)
    t, d = config.Config().train, config.Config().decode
    assert (t.label_smoothing, t.warmup, t.betas, t.eps) == (0.1, 4000, [0.9, 0.98], 1e-9)
    assert (d.beam, d.alpha, d.max_len_a, d.max_len_b) == (4, 0.6, 1.0, 50)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load(path):
    assert config.load(path).name


def test_gpu_base_config_is_the_base_model_with_whole_updates_per_batch():
    """configs/base-gpu.yaml differs from configs/base.yaml only in how it runs, never in what it trains."""
    base, gpu = (config.to_dict(config.load(CONFIGS[0].parent / f"{n}.yaml")) for n in ("base", "base-gpu"))
    for k in ("model", "data", "tokenizer", "decode"):
        assert gpu[k] == base[k], k
    assert {k for k in base["train"] if gpu["train"][k] != base["train"][k]} == {"batch_tokens", "accumulate"}
    assert gpu["train"]["batch_tokens"] * gpu["train"]["accumulate"] >= base["train"]["batch_tokens"] * base["train"]["accumulate"]
    assert (gpu["device"], gpu["precision"]) == ("cuda", "auto")


def test_unknown_key_suggests_the_right_one(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.warmpu'; did you mean 'train.warmup'\?"):
        config.load(_write(tmp_path, "train:\n  warmpu: 10\n"))


@pytest.mark.parametrize("text, pattern", [
    ("model:\n  dropout: 1.5\n", r"model.dropout: 1.5 is out of range"),
    ("model:\n  d_model: 100\n  h: 8\n", r"divisible by model.h"),
    ("model:\n  h: '8'\n", r"model.h: expected int"),
    ("precision: fp8\n", r"precision: 'fp8' is not one of"),
    ("model: 3\n", r"model: expected a section"),
    ("train:\n  betas: [0.9]\n", r"train.betas must be two numbers"),
    ("data:\n  src_lang: en\n  tgt_lang: en\n", r"pick two languages"),
    ("compile: true\n", r"compile: true is not supported: .* set compile: false"),
])
def test_bad_values_name_the_key(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config.load(_write(tmp_path, text))


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml: YAML syntax error at line 4, column 2"):
        config.load(_write(tmp_path, "name: x\nmodel:\n  N: 1\n d_model: 2\n"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml' not found"):
        config.load(tmp_path / "nope.yaml")


def test_dotted_overrides_are_typed(tmp_path):
    cfg = config.load(_write(tmp_path, "name: a\n"), ["train.warmup=200", "model.dropout=0.3", "name=b",
                                                       "train.peak_lr=1e-3", "train.betas=[0.8, 0.9]"])
    assert (cfg.train.warmup, cfg.model.dropout, cfg.name, cfg.train.peak_lr) == (200, 0.3, "b", 1e-3)
    assert cfg.train.betas == [0.8, 0.9]
    with pytest.raises(ConfigError, match="did you mean 'train.warmup'"):
        config.load(_write(tmp_path, ""), ["train.wamrup=1"])
    with pytest.raises(ConfigError, match="not key=value"):
        config.load(_write(tmp_path, ""), ["train.warmup"])


def test_dump_round_trips(tmp_path):
    cfg = config.load(CONFIGS[0])
    again = config.load(_write(tmp_path, config.dump(cfg)))
    assert config.to_dict(again) == config.to_dict(cfg)
