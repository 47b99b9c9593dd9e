"""The vocabulary of strict config validation: where a key came from (file,
line, `--set`), value kinds and bounds, sections that reject unknown keys,
and messages that say what is accepted (with a "did you mean")."""

import difflib
import math
import numbers
import os

import attrs

from servesim.errors import InputError

OVERRIDE = "--set"  # the origin of a key given by an override
REQUIRED = object()  # marks a key without a default


@attrs.frozen
class Ctx:
    """Where the data came from: names the file and line in messages and
    resolves relative paths."""

    source: str | None
    base_dir: str
    where: dict  # dotted key path -> 1-based line, or OVERRIDE
    override_dir: str | None = None  # relative paths given by overrides; None: the current directory

    def fail(self, path: str, message: str):
        """Raise the InputError for `path` (its line, else its nearest parent's)."""
        origin = self._origin(path)
        head = self.source or ""
        if head and isinstance(origin, int):
            head += f":{origin}"
        if path and origin == OVERRIDE:
            path = f"{OVERRIDE} {path}"
        prefix = ": ".join(p for p in (head, path) if p)
        raise InputError(f"{prefix}: {message}" if prefix else message)

    def _origin(self, path: str):
        while path:
            if path in self.where:
                return self.where[path]
            path = path.rpartition(".")[0]
        return None

    def resolve(self, path: str, key: str | None = None) -> str:
        """An absolute path for a file named in the config at `key`: relative
        to the config's folder, or, when an override gave `key`, to
        `override_dir` (default: the current directory)."""
        base = self.base_dir
        if key is not None and self._origin(key) == OVERRIDE:
            base = self.override_dir or os.getcwd()
        return os.path.abspath(os.path.join(base, os.path.expanduser(path)))


@attrs.frozen
class Kind:
    """A value type: its name in messages, its test and its conversion."""

    name: str
    accepts: object
    cast: object = lambda v: v


def is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


INT = Kind("an integer", is_int, int)


NUMBER = Kind("a number", is_number, float)


BOOL = Kind("true or false", lambda v: isinstance(v, bool), bool)


PATH = Kind("a file path", lambda v: isinstance(v, str) and v != "", str)


def enum(*choices: str) -> Kind:
    return Kind("one of " + ", ".join(choices), lambda v: isinstance(v, str) and v in choices, str)


def ge(bound):
    return (lambda v: v >= bound, f">= {bound}")


def gt(bound):
    return (lambda v: v > bound, f"> {bound}")


def lt(bound):
    return (lambda v: v < bound, f"< {bound}")


def le(bound):
    return (lambda v: v <= bound, f"<= {bound}")


def check(ctx: Ctx, path: str, value, kind: Kind, *bounds, nullable=False):
    """`value` converted by `kind`, or an InputError saying what is accepted."""
    if value is None and nullable:
        return None
    if kind.accepts(value) and all(test(kind.cast(value)) for test, _ in bounds):
        return kind.cast(value)
    message = f"must be {accepted(kind, bounds, nullable)}, got {show(value)}"
    if kind.name.startswith("one of") and isinstance(value, str):
        message += did_you_mean(value, kind.name[len("one of ") :].split(", "))
    ctx.fail(path, message)


class Section:
    """One mapping of the config at a dotted path: typed access to its keys,
    unknown keys rejected when it is opened."""

    def __init__(self, ctx: Ctx, data, path: str, keys, path_of=None):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            ctx.fail(path, f"must be a mapping, got {show(data)}")
        self.ctx, self.data, self.path, self.keys = ctx, data, path, keys
        self._path_of = path_of  # key -> its dotted path, for merged sections
        for key in data:
            if key not in keys:
                ctx.fail(self.sub(key), "unknown key" + did_you_mean(key, keys, list_all=True))

    def get(self, key: str, kind: Kind, default=REQUIRED, *bounds, nullable=False):
        """The checked value of `key`, or `default` when it is absent."""
        path = self.sub(key)
        if key not in self.data:
            if default is REQUIRED:
                self.ctx.fail(path, f"required key is missing ({accepted(kind, bounds)})")
            return default
        return check(self.ctx, path, self.data[key], kind, *bounds, nullable=nullable)

    def given(self, key: str) -> bool:
        return self.data.get(key) is not None

    def sub(self, key: str) -> str:
        if self._path_of is not None:
            return self._path_of(key)
        return join(self.path, key)


def tagged_section(ctx, data, path, tag, default, params_by_tag) -> tuple:
    """A mapping whose `tag` key (timing `type`, `distribution`) chooses its
    parameters; a parameter of another tag is named as such."""
    if not isinstance(data, dict):
        ctx.fail(path, f"must be a mapping with key {tag!r}, got {show(data)}")
    if tag not in data and default is REQUIRED:
        ctx.fail(join(path, tag), f"required key is missing ({enum(*params_by_tag).name})")
    value = check(ctx, join(path, tag), data.get(tag, default), enum(*params_by_tag))
    params = params_by_tag[value]
    for key in data:
        if key != tag and key not in params and any(key in p for p in params_by_tag.values()):
            accepted = ", ".join(params) or "none"
            ctx.fail(join(path, key), f"not a parameter of {tag} {value!r} (its parameters: {accepted})")
    return value, Section(ctx, data, path, (tag, *params))


def accepted(kind: Kind, bounds=(), nullable: bool = False) -> str:
    """What a key accepts, e.g. 'an integer >= 2 or null'."""
    text = " ".join([kind.name, *(desc for _, desc in bounds[:1])])
    text += "".join(f" and {desc}" for _, desc in bounds[1:])
    return text + (" or null" if nullable else "")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def did_you_mean(word: str, choices, list_all: bool = False) -> str:
    """' (did you mean 'x'?)', else the accepted choices when `list_all`."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f" (accepted: {', '.join(choices)})" if list_all else ""


def show(value) -> str:
    """A value as the user wrote it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return f"a list {value!r}" if len(repr(value)) < 60 else "a list"
    return repr(value)
