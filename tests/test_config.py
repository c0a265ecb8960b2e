"""Config loading, validation and overrides: every bad value is one clear ConfigError; shipped configs by name."""

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import configs
from transformer import config, config_file
from transformer.errors import ConfigError

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
    assert config_file.load(path).name


def test_gpu_base_config_is_the_base_model_with_whole_updates_per_batch():
    """configs/base-gpu.yaml differs from configs/base.yaml only in how it runs, never in what it trains."""
    base, gpu = (config_file.to_dict(config_file.load(CONFIGS[0].parent / f"{n}.yaml")) for n in ("base", "base-gpu"))
    for k in ("model", "data", "tokenizer", "decode"):
        assert gpu[k] == base[k], k
    how = {"batch_tokens", "accumulate", "static_shapes", "cuda_graphs", "compile", "prefetch"}  # the GPU levers
    assert {k for k in base["train"] if gpu["train"][k] != base["train"][k]} <= how
    assert (
        gpu["train"]["batch_tokens"] * gpu["train"]["accumulate"]
        >= base["train"]["batch_tokens"] * base["train"]["accumulate"]
    )
    assert (gpu["device"], gpu["precision"]) == ("cuda", "auto")


def test_yaml_merge_keys_work_and_own_keys_override_them(tmp_path):
    text = "decode: &d\n  beam: 3\n  alpha: 1.0\ntrain:\n  <<: {warmup: 7, max_steps: 9}\n  max_steps: 11\n"
    cfg = config_file.load(_write(tmp_path, text))
    assert (cfg.train.warmup, cfg.train.max_steps, cfg.decode.beam) == (7, 11, 3)
    with pytest.raises(ConfigError, match="key 'max_steps' appears twice"):  # the section's own keys still once
        config_file.load(_write(tmp_path, "train:\n  <<: {warmup: 7}\n  max_steps: 9\n  max_steps: 11\n"))


def test_a_config_file_takes_the_devices_the_command_line_takes(tmp_path):
    assert config_file.load(_write(tmp_path, "device: cuda:1\n")).device == "cuda:1"
    with pytest.raises(ConfigError, match=r"device: 'gpu' is not one of auto, cpu, cuda, cuda:N, mps"):
        config_file.load(_write(tmp_path, "device: gpu\n"))


def test_unknown_key_suggests_the_right_one(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.warmpu'; did you mean 'train.warmup'\?"):
        config_file.load(_write(tmp_path, "train:\n  warmpu: 10\n"))


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("model:\n  dropout: 1.5\n", r"model.dropout: 1.5 is out of range"),
        ("model:\n  d_model: 100\n  h: 8\n", r"divisible by model.h"),
        ("model:\n  h: '8'\n", r"model.h: expected int"),
        ("model: 3\n", r"model: expected a section"),
        ("train:\n  betas: [0.9]\n", r"train.betas must be two numbers"),
        ("data:\n  src_lang: en\n  tgt_lang: en\n", r"pick two languages"),
        ("compile: true\n", r"unknown config key 'compile'"),
        ("seed: -1\n", r"seed: -1 is out of range; it must be 0 to 4,294,967,295"),
        ("seed: 18446744073709551616\n", r"seed: 18446744073709551616 is out of range"),
        ("tokenizer:\n  min_frequency: -2\n", r"tokenizer.min_frequency: -2 is out of range"),
        ("train:\n  peak_lr: .nan\n", r"train.peak_lr: nan is out of range; it must be above 0 and at most 10"),
        ("train:\n  peak_lr: 1" + "0" * 400 + "\n", r"train.peak_lr: inf is out of range"),
        ("decode:\n  alpha: 1.0e+308\n", r"decode.alpha: 1e\+308 is out of range; it must be 0 to 10"),
        (
            "model:\n  d_model: 1073741824\n  h: 2\n",
            r"model.d_model: 1073741824 is out of range; it must be 1 to 65,536",
        ),
        ("data:\n  holdout: [1, 10000000000]\n", r"data.holdout must be \[valid_size, test_size\], both 1 to"),
        ("train:\n  peak_lr: -0.001\n", r"train.peak_lr: -0.001 is out of range"),
        ("train:\n  lr_factor: .inf\n", r"train.lr_factor: inf is out of range"),
        ("train:\n  max_minutes: -5\n", r"train.max_minutes: -5.0 is out of range"),
        ("train:\n  eval_sentences: 0\n", r"train.eval_sentences: 0 is out of range; it must be 1 to 1,000,000,000"),
        ("train:\n  cuda_graphs: true\n", r"train.cuda_graphs needs train.static_shapes: true"),
        ("train:\n  prefetch: -1\n", r"train.prefetch: -1 is out of range"),
    ],
)
def test_bad_values_name_the_key(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        config_file.load(_write(tmp_path, text))


def test_yaml_syntax_error_gives_line_and_column(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml: YAML syntax error at line 4, column 2"):
        config_file.load(_write(tmp_path, "name: x\nmodel:\n  N: 1\n d_model: 2\n"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml' not found"):
        config_file.load(tmp_path / "nope.yaml")


def test_dotted_overrides_are_typed(tmp_path):
    cfg = config_file.load(
        _write(tmp_path, "name: a\n"),
        ["train.warmup=200", "model.dropout=0.3", "name=b", "train.peak_lr=1e-3", "train.betas=[0.8, 0.9]"],
    )
    assert (cfg.train.warmup, cfg.model.dropout, cfg.name, cfg.train.peak_lr) == (200, 0.3, "b", 1e-3)
    assert cfg.train.betas == [0.8, 0.9]
    with pytest.raises(ConfigError, match="did you mean 'train.warmup'"):
        config_file.load(_write(tmp_path, ""), ["train.wamrup=1"])
    with pytest.raises(ConfigError, match="not key=value"):
        config_file.load(_write(tmp_path, ""), ["train.warmup"])


def test_dump_round_trips(tmp_path):
    cfg = config_file.load(CONFIGS[0])
    again = config_file.load(_write(tmp_path, config_file.dump(cfg)))
    assert config_file.to_dict(again) == config_file.to_dict(cfg)


def test_a_shipped_config_is_found_by_bare_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert config_file.find("base") == config_file.find("base.yaml") == CONFIGS[0].parent / "base.yaml"
    assert config_file.load("small").model.d_model == 256
    (tmp_path / "base.yaml").write_text("name: mine\n", encoding="utf-8")
    assert config_file.load("base.yaml").name == "mine"  # a file of the user's wins over the shipped one


def test_an_unknown_config_name_lists_the_shipped_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"config file 'bsae.yaml' not found; .* base, base-gpu, big, .*tfm configs"):
        config_file.load("bsae.yaml")
    with pytest.raises(ConfigError, match="not found"):
        config_file.load("elsewhere/base.yaml")  # a path is a path, never a shipped name


def test_every_shipped_config_says_what_it_is_for():
    assert set(configs.shipped()) == {p.stem for p in CONFIGS}
    assert all(configs.describe(p) for p in CONFIGS)


def test_the_paper_configs_carry_the_papers_values():
    base, big = config_file.load("wmt14-base"), config_file.load("wmt14-big")
    assert (base.model.N, base.model.d_model, base.model.d_ff, base.model.h, base.model.dropout) == (
        6,
        512,
        2048,
        8,
        0.1,
    )
    assert (big.model.N, big.model.d_model, big.model.d_ff, big.model.h, big.model.dropout) == (6, 1024, 4096, 16, 0.3)
    assert (base.train.max_steps, big.train.max_steps, base.train.keep_last, big.train.keep_last) == (
        100_000,
        300_000,
        5,
        20,
    )
    for c in (base, big):
        assert (c.tokenizer.vocab_size, c.train.batch_tokens, c.train.warmup, c.train.label_smoothing) == (
            37000,
            25000,
            4000,
            0.1,
        )
        assert (c.decode.beam, c.decode.alpha, c.decode.max_len_b, c.precision) == (4, 0.6, 50, "auto")
        assert (c.data.format, c.data.path, c.data.hf_config, c.data.hf_field) == (
            "hf",
            "wmt/wmt14",
            "de-en",
            "translation",
        )
        assert (c.data.valid_split, c.data.test_split) == ("validation", "test")


def test_an_installed_wheel_carries_the_configs(tmp_path):
    """Installed without -e, tfm still finds its configs by name, from a directory that is not the repository."""
    root, src = CONFIGS[0].parent.parent, tmp_path / "src"
    src.mkdir()  # built from a copy, so no build/ folder lands in the repository
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src)
    for name in ("transformer", "cli", "configs"):
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(src)],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "wheel").glob("tfm_nmt-*.whl"))
    subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)], check=True, capture_output=True
    )
    code = "from transformer import config_file; print(config_file.find('base'), config_file.load('wmt14-base').name)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [str(tmp_path / "site" / "configs" / "base.yaml"), "wmt14-base"]


@pytest.mark.parametrize(
    "key, guess",
    [
        ("train.lerning_rate", "did you mean 'train.peak_lr' or 'train.lr_factor'?"),
        ("train.batch_size", "did you mean 'train.batch_tokens'?"),
        ("model.num_layers", "did you mean 'model.encoder_layers' or 'model.N'?"),
        ("decode.beam_size", "did you mean 'decode.beam'?"),
    ],
)
def test_keys_from_other_toolkits_suggest_the_keys_that_mean_the_same(key, guess):
    with pytest.raises(ConfigError, match=re.escape(f"unknown config key '{key}'; {guess}")):
        config_file.from_dict({}, [f"{key}=1"])


def test_a_bad_override_is_blamed_on_set_not_on_the_file(tmp_path):
    path = _write(tmp_path, "train:\n  warmup: 10\n")
    with pytest.raises(ConfigError, match=r"^--set train.max_steps: 0 is out of range"):
        config_file.load(path, ["train.max_steps=0"])
    with pytest.raises(ConfigError, match=r"^--set unknown config key 'train.nope'"):
        config_file.load(path, ["train.nope=1"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: train.warmup: 0 is out of range"):
        config_file.load(_write(tmp_path, "train:\n  warmup: 0\n"), ["train.max_steps=5"])


def test_a_key_given_twice_is_refused_with_its_line(tmp_path):
    with pytest.raises(ConfigError, match=r"c.yaml: line 4: key 'warmup' appears twice in one section; keep one"):
        config_file.load(_write(tmp_path, "name: a\ntrain:\n  warmup: 3\n  warmup: 4\n"))


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "", "a b"])
def test_a_run_name_is_a_plain_name_so_the_run_stays_in_run_dir(name):
    with pytest.raises(ConfigError, match="must be a plain name"):
        config_file.from_dict({"name": name})


def test_an_unreadable_config_is_one_line(tmp_path):
    folder = tmp_path / "dir.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="not found"):
        config_file.load(folder)


@pytest.mark.parametrize("columns", [["en", "de"], ["en", "zh", "en"]])
def test_tsv_columns_are_validated(columns: list[str]) -> None:
    data = {"format": "tsv", "src_lang": "en", "tgt_lang": "zh", "tsv_columns": columns}
    with pytest.raises(ConfigError, match="data.tsv_columns"):
        config_file.from_dict({"data": data})


def _laughs(levels: int) -> str:
    """Nested anchors under a known key, each level ten of the one before, the last used as model.N."""
    rows = ["seed:", "  - &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    rows += [f"  - &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(rows) + f"\nmodel: {{N: *a{levels - 1}}}\n"


@pytest.mark.parametrize(
    "text, pattern",
    [
        (_laughs(5), r"aliases expand to over 10,000 values"),
        (_laughs(12), r"aliases expand to over 10,000 values"),
        ("seed: &a [*a]\n", r"an alias refers to itself"),
        ("seed: " + "[" * 100_000 + "]" * 100_000 + "\n", r"values nested too deeply"),
        ("seed: [" + "1, " * 400_000 + "1]\n", r"bytes; a config is a few kilobytes"),
    ],
)
def test_yaml_that_would_grow_without_bound_is_refused_quickly_in_a_short_line(tmp_path, text, pattern):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=pattern) as e:
        config_file.load(_write(tmp_path, text))
    assert len(str(e.value)) < 300 and time.monotonic() - start < 10


def test_a_value_shown_in_an_error_is_cut_short(tmp_path):
    with pytest.raises(ConfigError, match=r"seed: expected int, got \[1, 1, .*\.\.\. \(list\)") as e:
        config_file.load(_write(tmp_path, "seed: [" + "1, " * 1000 + "1]\n"))
    assert len(str(e.value)) < 300
    with pytest.raises(ConfigError, match="an alias refers to itself"):
        config_file.from_dict({}, ["seed=&a [*a]"])


@pytest.mark.parametrize(
    "directions, pattern",
    [
        ("[]", "data.directions is empty"),
        ("[de_en]", "data.directions: 'de_en' is not source-target"),
        ("[de-en, en-en]", "data.directions: en-en translates en into itself"),
        ("[de-en, fr-en, de-en]", "data.directions names de-en twice"),
    ],
)
def test_directions_are_source_target_each_once(directions, pattern):
    with pytest.raises(ConfigError, match=re.escape(pattern)):
        config_file.from_dict({}, [f"data.directions={directions}"])


def test_directions_name_the_pairs_a_run_trains():
    cfg = config_file.from_dict({}, ["data.directions=[de-en, fr-en]"])
    assert cfg.data.pairs() == [("de", "en"), ("fr", "en")] and cfg.data.tagged
    assert config.Config().data.pairs() == [("de", "en")] and not config.Config().data.tagged


def test_a_file_of_ten_thousand_plain_keys_is_not_called_nested_anchors(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("".join(f"key{i}: {i}\n" for i in range(10_001)))
    with pytest.raises(ConfigError, match="holds over 10,000 values; a config is a few dozen key: value lines"):
        config_file.load(path)


def test_a_huge_override_key_is_cut_in_the_message():
    for item in ("k" * 100_000 + "=1", "k" * 100_000):
        with pytest.raises(ConfigError) as e:
            config_file.from_dict({}, [item])
        assert len(str(e.value)) < 160
