"""Reading config data: YAML files into plain data with the line of every key,
and `--set dotted.key=value` overrides applied in place."""

import numbers
from pathlib import Path

from ruamel.yaml import YAML, YAMLError
from ruamel.yaml.comments import CommentedMap

from servesim.errors import InputError
from servesim.config.validation import OVERRIDE, join, show


def read_text(path: str, what: str) -> str:
    """A UTF-8 input file's text, or an InputError naming the file and `what`
    it was meant to be."""
    try:
        return Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: {what} is not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what}: {e.strerror or e}") from None


def parse_yaml(text: str, path: str):
    """The ruamel round-trip document (it keeps the line of every key), or an
    InputError naming the file and line of the syntax error."""
    try:
        return YAML(typ="rt").load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"{path}{line}: invalid YAML: {problem}") from None


def read_yaml(path: str, what: str):
    """Parse a YAML file into plain data and {dotted key path: line}."""
    doc = parse_yaml(read_text(path, what), path)
    where: dict = {}
    try:
        return plain_data(doc, "", where), where
    except YAMLShapeError as e:
        raise InputError(f"{path}: {e}") from None


# At most this many values after expanding aliases: a config or grid has
# hundreds; an "alias bomb" (a few lines, each alias doubling the last)
# would expand to billions.
MAX_NODES = 100_000


class YAMLShapeError(InputError):
    """A document that expands beyond MAX_NODES or refers to itself."""


def plain_data(node, path: str, where: dict, _state=None):
    """Plain dicts, lists and scalars from ruamel (or API) data; records the
    1-based line of every mapping key in `where`. Refuses (YAMLShapeError) a
    document that expands to more than MAX_NODES values through aliases, or
    that contains itself (a recursive alias)."""
    if _state is None:
        _state = [0, set()]  # values so far, ids of the collections being converted
    _state[0] += 1
    if _state[0] > MAX_NODES:
        raise YAMLShapeError(f"more than {MAX_NODES} values once aliases are expanded "
                             f"(an alias bomb?); refused")
    if isinstance(node, (dict, list, tuple)):
        if id(node) in _state[1]:
            raise YAMLShapeError(f"{path or 'the document'}: a recursive alias (the value contains itself)")
        _state[1].add(id(node))
        try:
            if isinstance(node, dict):
                out = {}
                for key, value in node.items():
                    key_path = join(path, str(key))
                    if isinstance(node, CommentedMap):
                        try:
                            where[key_path] = node.lc.key(key)[0] + 1
                        except (KeyError, TypeError):
                            pass
                    out[str(key)] = plain_data(value, key_path, where, _state)
                return out
            return [plain_data(item, path, where, _state) for item in node]
        finally:
            _state[1].discard(id(node))
    if isinstance(node, bool) or type(node).__name__ == "ScalarBoolean":
        return bool(node)
    if isinstance(node, numbers.Integral):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


UNSET = "!unset"  # `--set KEY=!unset` removes KEY (a grid's null value): the config's default applies


def apply_override(data: dict, where: dict, text: str) -> None:
    """Apply one `dotted.key=value` override in place; the value is YAML
    (scalar or flow collection) and replaces what was there. The value
    `!unset` removes the key instead (nothing there is no error), so the
    default applies: a grid mixing aggregated and disaggregated points
    unsets `cluster.workers` on the disaggregated ones."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise InputError(f"{OVERRIDE} {text!r}: expected dotted.key=value, e.g. engine.num_gpu_blocks=4096")
    if raw.strip() == UNSET:
        _unset(data, where, parts)
        return
    try:
        value = plain_data(YAML(typ="safe", pure=True).load(raw), "", {})
    except YAMLError as e:
        raise InputError(f"{OVERRIDE} {key}: cannot parse {raw!r} as a YAML value: {getattr(e, 'problem', e)}") from None
    node = data
    for i, part in enumerate(parts[:-1]):
        prefix = ".".join(parts[: i + 1])
        if node.get(part) is None:
            node[part] = {}
            where[prefix] = OVERRIDE
        elif not isinstance(node[part], dict):
            raise InputError(f"{OVERRIDE} {key}: {prefix} is {show(node[part])}, not a mapping")
        node = node[part]
    node[parts[-1]] = value
    for stale in [p for p in where if p.startswith(key + ".")]:
        del where[stale]
    where[key] = OVERRIDE


def _unset(data: dict, where: dict, parts: list) -> None:
    node = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return
    if isinstance(node, dict):
        node.pop(parts[-1], None)
    key = ".".join(parts)
    for stale in [p for p in where if p == key or p.startswith(key + ".")]:
        del where[stale]
