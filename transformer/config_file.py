"""A config as YAML: a shipped config found by name, a file read safely, ``--set key=value`` overrides read as YAML
values, plain values applied and checked into a Config (transformer.config), and the resolved config written back.

A file is read with YAML's safe loader, a key given twice in one section is an error, and a file's size and the
values its aliases expand to are bounded, so that no YAML can grow without bound as it is read.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from configs import shipped
from transformer.config import Config, brief, validate
from transformer.errors import ConfigError

# Names users bring from other toolkits, and the keys that mean the same here.
_SYNONYMS = {
    "learning_rate": ("peak_lr", "lr_factor"),
    "lr": ("peak_lr", "lr_factor"),
    "batch_size": ("batch_tokens",),
    "max_tokens": ("batch_tokens",),
    "epochs": ("max_epochs",),
    "steps": ("max_steps",),
    "warmup_steps": ("warmup",),
    "update_freq": ("accumulate",),
    "layers": ("N",),
    "num_layers": ("N",),
    "heads": ("h",),
    "num_heads": ("h",),
    "hidden_size": ("d_model",),
    "ffn_dim": ("d_ff",),
    "beam_size": ("beam",),
    "length_penalty": ("alpha",),
    "vocab": ("vocab_size",),
    "smoothing": ("label_smoothing",),
}


def _suggest(key: str, names: list[str]) -> list[str]:
    """Known keys a mistyped or foreign ``key`` probably meant: close spellings, then synonyms (typos included)."""
    close = difflib.get_close_matches(key, names, n=2)
    for synonym in difflib.get_close_matches(key.lower(), list(_SYNONYMS), n=1, cutoff=0.8):
        close += [n for n in _SYNONYMS[synonym] if n in names and n not in close]
    return close


def _check_type(key: str, value: Any, hint: Any) -> Any:
    """Return ``value`` coerced to ``hint`` where that is lossless, else raise ConfigError."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _check_type(key, value, inner[0])
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {brief(value)}; write it as [a, b, ...]")
        return [_check_type(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return math.inf if isinstance(value, int) and abs(value) > 1e308 else float(value)  # past any float
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif hint is str:
        if isinstance(value, str):
            return value
    name = getattr(hint, "__name__", str(hint))
    raise ConfigError(f"{key}: expected {name}, got {brief(value)} ({type(value).__name__}); fix its value")


def apply(obj: Any, values: dict[str, Any], prefix: str = "") -> None:
    """Set the fields of dataclass ``obj`` from ``values``, recursing into sections."""
    hints = typing.get_type_hints(type(obj))
    names = [f.name for f in dataclasses.fields(obj)]
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if key not in names:
            close = _suggest(str(key), names)
            guess = " or ".join(f"'{prefix}{c}'" for c in close)
            hint = f"; did you mean {guess}?" if close else f"; known keys: {', '.join(names)}"
            raise ConfigError(f"unknown config key '{dotted}'{hint}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{dotted}: expected a section (key: value lines), got {brief(value)}")
            apply(current, value, f"{dotted}.")
        else:
            setattr(obj, key, _check_type(dotted, value, hints[key]))


def _parse_scalar(text: str) -> Any:
    """Read an override value the way YAML would (``3``, ``0.1``, ``true``, ``[1, 2]``, ``null``)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise ConfigError(f"'{text[:40]}...' is nested too deeply; give a plain value") from None


def overrides_to_dict(overrides: list[str]) -> dict[str, Any]:
    """Turn ``["train.warmup=200", "name=x"]`` into a nested dict."""
    nested: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            shown = item if len(item) <= 60 else f"{item[:40]}..."
            raise ConfigError(f"override '{shown}' is not key=value; write e.g. --set train.warmup=200")
        key, text = item.split("=", 1)
        if len(key) > 200:
            raise ConfigError(
                f"override key '{key[:40]}...' is {len(key):,} characters; keys are names such as train.warmup"
            )
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _parse_scalar(text)
    return nested


def from_dict(values: dict[str, Any], overrides: list[str] | None = None) -> Config:
    """Build and validate a Config from plain values plus ``key=value`` overrides.

    An error caused by an override says so (``--set ...``), so that it is not blamed on the file.
    """
    cfg = Config()
    apply(cfg, values)
    keys = [item.split("=", 1)[0].strip() for item in overrides or []]
    try:
        if overrides:
            apply(cfg, overrides_to_dict(overrides))
    except ConfigError as e:
        raise ConfigError(f"--set {e}") from None
    try:
        return validate(cfg)
    except ConfigError as e:
        if any(k and k in str(e) for k in keys):
            raise ConfigError(f"--set {e}") from None
        raise


def find(name: str | Path) -> Path:
    """The config file ``name``: a path that exists, else a shipped config (``base`` or ``base.yaml``)."""
    p = Path(name)
    if p.is_file():
        return p
    configs = shipped()
    if p.parent == Path(".") and p.suffix in ("", ".yaml", ".yml") and p.stem in configs:
        return configs[p.stem]
    raise ConfigError(
        f"config file '{p}' not found; give a YAML file or a shipped config: "
        f"{', '.join(configs)} (tfm configs says what each is for)"
    )


MAX_BYTES = 1 << 20  # a config is a few kilobytes
MAX_VALUES = 10_000  # values a config may hold once its aliases are expanded (a shipped one holds about 100)


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one section is an error, not a silent overwrite, and
    that aliases may not expand past MAX_VALUES values (nested anchors, "billion laughs", would otherwise grow
    without bound as the values are read) nor refer to themselves.

    A merge key (``<<: *anchor``) is YAML's own: the keys it brings may be overridden by the section's own.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        _expanded(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ConfigError(
                    f"line {key_node.start_mark.line + 1}: key '{key}' appears twice in one section; keep one"
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``node`` holds once every alias is expanded (each shared node counted once per use, computed
    once); past MAX_VALUES, or an alias inside itself, is a ConfigError."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise ConfigError(f"line {node.start_mark.line + 1}: an alias refers to itself; write the values out")
    open_.add(key)
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1 + sum(_expanded(child, sizes, open_) for child in children)
    if size > MAX_VALUES:
        written = sum(1 for _ in _nodes(node, set()))
        why = (
            f"aliases expand to over {MAX_VALUES:,} values (nested anchors, line {node.start_mark.line + 1}); "
            "a config is plain key: value lines, write them out"
            if written <= MAX_VALUES
            else f"it holds over {MAX_VALUES:,} values; a config is a few dozen key: value lines, give one"
        )
        raise ConfigError(why)
    open_.discard(key)
    sizes[key] = size
    return size


def _nodes(node: yaml.Node, seen: set[int]) -> Iterator[yaml.Node]:
    """Each node written under ``node``, once (an alias's target is not counted again)."""
    if id(node) in seen:
        return
    seen.add(id(node))
    yield node
    children = node.value if isinstance(node, yaml.SequenceNode) else []
    if isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    for child in children:
        yield from _nodes(child, seen)


def load(path: str | Path, overrides: list[str] | None = None) -> Config:
    """Load a YAML config file (or a shipped one by name); errors name the file, and for syntax errors the line and
    column."""
    p = find(path)
    try:
        if (size := p.stat().st_size) > MAX_BYTES:
            raise ConfigError(f"{size:,} bytes; a config is a few kilobytes of key: value lines, give one")
        values = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader) or {}
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ConfigError(f"{p}: YAML syntax error at {where}: {e.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read YAML ({e}); fix the file") from None
    except RecursionError:
        raise ConfigError(f"{p}: values nested too deeply; a config is plain key: value lines") from None
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    except OSError as e:
        raise ConfigError(
            f"cannot read config file '{p}': {e.strerror or e}; check that it is a readable file"
        ) from None
    if not isinstance(values, dict):
        raise ConfigError(f"{p}: top level must be key: value lines, got {type(values).__name__}")
    try:
        return from_dict(values, overrides)
    except ConfigError as e:
        raise ConfigError(str(e) if str(e).startswith("--set ") else f"{p}: {e}") from None


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested values, as written into a run directory's config.yaml."""
    return dataclasses.asdict(cfg)


def dump(cfg: Config) -> str:
    """The resolved config as YAML text."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)
