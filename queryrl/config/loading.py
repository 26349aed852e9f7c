"""Loading a config: schema defaults, then a YAML file, then dotted overrides; saving it redacted."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf, StringNode, open_dict
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from queryrl.application import load_apps
from queryrl.atomic import atomic_write_text
from queryrl.config.aliases import VERL_WITHOUT_MEANING, all_aliases, translate_key
from queryrl.config.schema import ConfigError, build_schema
from queryrl.config.validation import validate
from queryrl.plugins import not_a_file

# dict-typed fields whose keys are the user's
_FREE_FORM = ("reward.kwargs", "rollout.vllm.extra")  # and each application's `free_form`
# "token" only as the key's last word (hf_token, access_token): not max_tokens, tokenizer_path, token_limit_param
_SECRET_KEY = re.compile(r"(api_?key|token$|secret|password)", re.IGNORECASE)


def _flatten(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dict -> dotted (key, leaf) pairs; a dict under a dict-typed field stays a leaf."""
    if not isinstance(node, dict) or not node:
        return [(prefix, node)]
    out: list[tuple[str, Any]] = []
    for k, v in node.items():
        out += _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def known_keys() -> list[str]:
    """Every dotted key a config or override may name: the schema's leaves and the verl aliases."""
    schema = OmegaConf.to_container(build_schema())
    leaves = [k for k, _ in _flatten(schema)]
    verl = [k for k in list(all_aliases()) + list(VERL_WITHOUT_MEANING) if not k.endswith(".*")]
    return leaves + verl


def _unknown_key_message(given: str, key: str) -> str:
    """'unknown key ...; did you mean ...?' with the closest known keys (difflib)."""
    named = {given.lstrip("+"), key}
    candidates = [k for k in dict.fromkeys(known_keys()) if k not in named]  # never the key itself, never twice
    close = difflib.get_close_matches(given.lstrip("+"), candidates, n=2, cutoff=0.75)
    if not close and given.lstrip("+") != key:  # a verl alias that resolved to a bad queryrl key
        close = difflib.get_close_matches(key, candidates, n=2, cutoff=0.75)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"unknown key {given.lstrip('+')!r}{hint}"


@dataclass(frozen=True)
class _Plain:
    """A plain (unquoted) YAML scalar that YAML read as a bool, a number or null, with the text as written.

    YAML 1.1 reads ``off``/``no``/``on``/``yes`` as booleans: ``rollout.fast_decode=off`` would reach a
    str field as ``"False"``. A str field takes the text instead (see :func:`_as_written`).
    """

    value: Any
    text: str


def _plain(value: Any, text: str) -> Any:
    """`value`, wrapped with its `text` when YAML resolved a plain scalar to something other than a string."""
    return _Plain(value, text.strip()) if value is None or isinstance(value, bool | int | float) else value


def _as_written(cfg: DictConfig, key: str, value: Any) -> Any:
    """A :class:`_Plain` -> its text for a str field (null stays None where the field is optional), else its value."""
    if not isinstance(value, _Plain):
        return value
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    try:
        node = parent._get_node(leaf) if isinstance(parent, DictConfig) else None
    except OmegaConfBaseException:  # an unknown key: _set names it
        node = None
    if not isinstance(node, StringNode):  # bool, number, Any, free-form mapping: YAML's reading is meant
        return value.value
    if value.value is None and node._is_optional():
        return None
    return value.text


def _set(cfg: DictConfig, key: str, value: Any, where: str, given: str | None = None) -> None:
    value = _as_written(cfg, key, value)
    is_list = isinstance(OmegaConf.select(cfg, key, default=None, throw_on_missing=False), ListConfig)
    if isinstance(value, str) and value != "???" and is_list:
        value = [value]  # verl scripts give one file (or one logger) as a plain string
    whole = key in _free_form()  # a whole free-form mapping (``document_fields={doc_id: id}``) replaces it
    free = key if whole else next((f for f in _free_form() if key.startswith(f + ".")), None)
    try:
        if free is None:
            OmegaConf.update(cfg, key, value, merge=True)
        else:  # a free-form mapping (e.g. reward.kwargs) takes any key
            with open_dict(OmegaConf.select(cfg, free)):
                OmegaConf.update(cfg, key, value, merge=not whole)
    except (ConfigKeyError, ConfigAttributeError):
        raise ConfigError(f"{where}: {_unknown_key_message(given or key, key)}") from None
    except OmegaConfBaseException as exc:
        msg = str(exc).split("\n")[0]
        raise ConfigError(f"{where}: bad key or value {key}={value!r}: {msg}") from None


def _one_error(problems: list[str]) -> ConfigError:
    """All problems of one config as one error (one message to fix them all in one go)."""
    if len(problems) == 1:
        return ConfigError(problems[0])
    return ConfigError(f"{len(problems)} problems in the config:\n" + "\n".join(f"  - {p}" for p in problems))


def _apply(cfg: DictConfig, items: list[tuple[str, Any, str]]) -> list[str]:
    """Set every (given key, value, where) on `cfg`; the errors, collected rather than raised."""
    problems: list[str] = []
    for given, value, where in items:
        try:
            _set(cfg, translate_key(given), value, where, given)
        except ConfigError as exc:
            problems.append(str(exc) if str(exc).startswith(where) else f"{where}: {exc}")
    return problems


def _file_items(path: Path) -> list[tuple[str, Any, str]]:
    if not path.is_file():
        raise ConfigError(f"config file {path} {'does not exist' if not path.exists() else not_a_file(path)}")
    try:
        raw = OmegaConf.to_container(OmegaConf.load(path))
        # the text of each plain scalar, from the same nodes OmegaConf read
        texts = _plain_texts(yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader))
    except Exception as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return [(key, _plain(value, texts[key]) if key in texts else value, str(path)) for key, value in _flatten(raw)]


def _plain_texts(node: yaml.Node | None, prefix: str = "") -> dict[str, str]:
    """Dotted key -> the text of each plain (unquoted) scalar of a YAML mapping, as written."""
    if isinstance(node, yaml.MappingNode):
        out: dict[str, str] = {}
        for k, v in node.value:
            out |= _plain_texts(v, f"{prefix}.{k.value}" if prefix else str(k.value))
        return out
    if isinstance(node, yaml.ScalarNode) and node.style is None and prefix:
        return {prefix: str(node.value)}
    return {}


def _override_items(overrides: list[str]) -> tuple[list[tuple[str, Any, str]], list[str]]:
    items: list[tuple[str, Any, str]] = []
    problems: list[str] = []
    for item in overrides:
        if "=" not in item:
            problems.append(f"override {item!r} is not of the form key=value")
            continue
        key, raw = item.split("=", 1)
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))
        except Exception as exc:  # OmegaConf's grammar or YAML's parser: either way, the value is unreadable
            problems.append(f"override {item!r}: bad value: {' '.join(str(exc).split())}")
            continue
        assert isinstance(parsed, dict)
        items.append((key.strip(), _plain(parsed["v"], raw), f"override {item!r}"))
    return items, problems


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, allow_missing: bool = False
) -> DictConfig:
    """The schema's defaults, then the YAML file at `path`, then the dotted `overrides`.

    YAML files and overrides may use verl's key names. Raises :class:`ConfigError` naming the
    key for an unknown key (with the closest known keys), a wrong type or an invalid value; every
    bad key of the file and the command line is reported in the one error. The users' launch-script
    keys are then resolved by the applications (:meth:`~queryrl.application.Application.resolve`)
    and the whole is validated. With
    `allow_missing`, a preset's ``???`` values stay unset instead of being an error (for commands such
    as ``eval`` that read only part of the config; reading such a value raises).
    """
    cfg = build_schema()
    items = _file_items(Path(path)) if path is not None else []
    more, problems = _override_items(overrides or [])
    problems = _apply(cfg, items + more) + problems
    if problems:
        raise _one_error(problems)
    for app in load_apps():  # e.g. the users' launch-script keys -> where they take effect
        app.resolve(cfg)
    missing = sorted(OmegaConf.missing_keys(cfg))
    # a preset's ``???``: a value only the user can give (a model folder, their data, their service)
    if missing and not allow_missing:
        where = f" (the preset {path} marks them ???)" if path is not None else ""
        raise ConfigError(f"these keys must be given{where}: " + ", ".join(f"{k}=..." for k in missing))
    validate(cfg)
    return cfg


def _free_form() -> tuple[str, ...]:
    """Dict-typed keys whose keys are the user's: the core's and the applications'."""
    return _FREE_FORM + tuple(f"app.{app.name}.{key}" for app in load_apps() for key in app.free_form)


def redacted(cfg: DictConfig) -> dict[str, Any]:
    """The config as plain data with secret-looking values replaced by ``***``."""

    def walk(node: Any, key: str = "") -> Any:
        if isinstance(node, dict):
            return {k: walk(v, str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, key) for v in node]
        if isinstance(node, str) and node and _SECRET_KEY.search(key) and not key.endswith("_env"):
            return "***"
        return node

    container = OmegaConf.to_container(cfg, resolve=True)
    result: dict[str, Any] = walk(container)
    return result


def save_config(cfg: DictConfig, path: Path) -> None:
    """Write the resolved config, secrets redacted, to `path` (via a temporary name)."""
    atomic_write_text(path, OmegaConf.to_yaml(OmegaConf.create(redacted(cfg))))


def as_list(value: ListConfig | list[Any] | str | None) -> list[Any]:
    """A config value that may be one item or a list -> a list."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)
