"""Body validation for message types, bounded so that no body or schema can make it crash or hang.

Plain Python, no Ray. A `BodyValidator` is built once per message type (a schema compiles once) and
checks every body of that type. The bounds, all documented in docs/concepts.md:

- JSON bodies ("json", "json_schema") nest at most `MAX_BODY_DEPTH` arrays/objects and hold no
  NaN or Infinity (they are not JSON);
- a "json_schema" body is at most `MAX_SCHEMA_BODY_BYTES`: schema checks (regexes above all) cost
  more per byte than parsing;
- a schema must have every `$ref` resolvable within itself (nothing is fetched), valid regexes,
  and no regex that repeats a group that itself repeats or has overlapping alternatives
  (`(a+)+`, `(a*)*`, `(a|a)*`): those backtrack exponentially on a short string;
- any failure of the schema library while checking a body is `ValidationFailed`, never a raw
  exception.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, Protocol

import msgpack

from actors.errors import InvalidDefinition, ValidationFailed, shown


class Validated(Protocol):
    """What a validator reads of a message type (`actors.model.catalog.MessageType`)."""

    name: str
    validation: str
    schema: Any


MAX_BODY_DEPTH = 100  # arrays/objects a JSON body may nest
MAX_DEFINITION_DEPTH = 64  # dicts/lists a definition (a schema above all) may nest
MAX_SCHEMA_BODY_BYTES = 1 << 20


def too_deep(value: object, limit: int) -> bool:
    """Whether dicts, lists and tuples nest more than `limit` levels in `value` (a cycle does).
    Iterative, and stops at the first path that is too deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            inner: Any = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            inner = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((x, depth + 1) for x in inner)
    return False


class _NotJson(ValueError):
    """NaN or Infinity in a body: Python's json accepts them, JSON does not."""


def _no_constants(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON value")


def parse_json(body: bytes) -> tuple[Any, str | None]:
    """(document, None), or (None, why it is not an acceptable JSON body)."""
    try:
        doc = json.loads(body, parse_constant=_no_constants)
    except _NotJson as exc:
        return None, f"is not JSON: {exc}"
    except RecursionError:  # json gives up near the interpreter's limit: far past ours
        return None, f"nests arrays/objects more than {MAX_BODY_DEPTH} deep"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"is not well-formed JSON ({exc})"
    # a body with few brackets cannot nest deeply: most bodies skip the walk
    if body.count(b"[") + body.count(b"{") > MAX_BODY_DEPTH and too_deep(doc, MAX_BODY_DEPTH):
        return None, f"nests arrays/objects more than {MAX_BODY_DEPTH} deep"
    return doc, None


# --- schemas ---------------------------------------------------------------------------------


def compile_schema(name: str, schema: Any, strict: bool = True) -> Any:
    """A jsonschema validator for a message type's schema, or InvalidDefinition saying why the
    schema may not be used. `strict=False` (a definition loaded from the store, which a broker
    before these checks may have accepted) skips the checks of refs, regexes and loops: the
    broker still starts, and checking a body still fails only with ValidationFailed."""
    import jsonschema  # imported lazily: only schema-validated types pay for it

    def refuse(why: str) -> InvalidDefinition:
        return InvalidDefinition(f"message type {name!r} has an invalid JSON schema: {why}")

    if strict and not (isinstance(schema, bool) or plain_json_object(schema)):
        # bytes, sets, tuples, NaN, keys that are not strings ...: stored, sent and checked as
        # JSON, a schema must be JSON data, whatever its validator would make of the rest
        raise refuse(
            f"it is not JSON data ({shown(schema)}); use only objects with string keys, "
            "arrays, strings, finite numbers, true, false and null"
        )
    cls = jsonschema.validators.validator_for(schema)
    if not strict:
        return cls(schema)
    if too_deep(schema, MAX_DEFINITION_DEPTH):
        raise refuse(f"it nests more than {MAX_DEFINITION_DEPTH} levels; flatten it with $defs")
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise refuse(exc.message) from None
    except RecursionError:
        raise refuse("it nests too deeply to check; flatten it with $defs") from None
    try:
        for kind, text in _walk_schema(schema):
            if kind == "$ref":
                continue  # resolved by the walk itself
            why = regex_hazard(text)
            if why:
                raise refuse(f"{kind} {shown(text)} {why}")
    except InvalidDefinition:
        raise
    except Exception as exc:  # referencing raises several unrelated types
        raise refuse(
            f"a $ref cannot be resolved within the schema ({exc}); define what it names "
            "under $defs (nothing is fetched from elsewhere)"
        ) from None
    validator = cls(schema)
    # a schema that refers to itself without consuming input ({"$ref": "#"}) loops forever
    for sample in (None, 0, "", [], {}):
        try:
            next(iter(validator.iter_errors(sample)), None)
        except RecursionError:
            raise refuse("it refers to itself without end (a $ref loop)") from None
        except Exception as exc:
            raise refuse(f"it cannot be applied ({type(exc).__name__}: {exc})") from None
    return validator


def _walk_schema(schema: Any) -> Iterator[tuple[str, str]]:
    """("$ref", ref) for every reference (after resolving it: raises if it does not resolve),
    and ("pattern" | "patternProperties", regex) for every regex, in every subschema."""
    import referencing
    import referencing.jsonschema as specs

    dialect = schema.get("$schema") if isinstance(schema, Mapping) else None
    spec = specs.DRAFT202012  # what jsonschema assumes without a $schema
    if isinstance(dialect, str):
        spec = specs.specification_with(dialect, default=spec)
    root = spec.create_resource(schema)
    base = root.id() or ""
    registry: referencing.Registry = referencing.Registry().with_resource(base, root).crawl()
    todo = [(root, registry.resolver(base_uri=base))]
    while todo:
        resource, resolver = todo.pop()
        contents = resource.contents
        if isinstance(contents, Mapping):
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                ref = contents.get(key)
                if isinstance(ref, str):
                    resolver.lookup(ref)
                    yield "$ref", ref
            if isinstance(contents.get("pattern"), str):
                yield "pattern", contents["pattern"]
            props = contents.get("patternProperties")
            if isinstance(props, Mapping):
                yield from (("patternProperties", k) for k in props if isinstance(k, str))
        todo.extend((sub, resolver.in_subresource(sub)) for sub in resource.subresources())


_QUANT = re.compile(r"\*|\+|\?|\{(\d*)(?:(,)(\d*))?\}")
_GROUP_OPENERS = ("(?P<", "(?<=", "(?<!", "(?:", "(?=", "(?!", "(?>", "(?#", "(?P=")


def regex_hazard(pattern: str) -> str | None:
    """Why a schema regex may not be used, or None. Refused: a regex Python cannot compile, and
    (a simple conservative check, not a proof) a group repeated without bound, or 10 or more
    times, that itself holds an unbounded repeat or alternatives one of which is a prefix of
    another: (a+)+, (a*)*, (\\d+\\.?)*, (a|a)*, (a|ab)+. Atomic groups (?>...) and possessive
    repeats (a++) do not backtrack, so they are allowed: they are the way to write these."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"is not a valid regular expression ({exc})"
    # frames: [unbounded repeat inside?, atomic?, branches (raw text of each alternative), start]
    frames: list[list[Any]] = [[False, False, [""], 0]]
    i, n = 0, len(pattern)
    while i < n:
        c, start = pattern[i], i
        if c == "\\":
            i += 2
        elif c == "[":
            i += 1
            if i < n and pattern[i] == "^":
                i += 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
        elif c == "(":
            opener = next((o for o in _GROUP_OPENERS if pattern.startswith(o, i)), "(")
            if opener in ("(?P<", "(?P="):
                i = pattern.index(">", i) + 1 if opener == "(?P<" else pattern.index(")", i)
            else:
                i += len(opener)
            frames.append([False, opener == "(?>", [""], start])
            continue
        elif c == "|":
            frames[-1][2].append("")
            i += 1
            continue
        elif c == ")":
            inner_unbounded, atomic, branches, opened = frames.pop()
            repeats, unbounded, i = _quantifier(pattern, i + 1)
            if repeats and not atomic:
                if inner_unbounded:
                    return "repeats a group that itself repeats without bound: " + _HINT
                if _overlapping(branches):
                    return "repeats a group whose alternatives overlap: " + _HINT
            # an atomic group gives nothing back, so what repeats inside it stays inside it
            frames[-1][0] = frames[-1][0] or (inner_unbounded and not atomic) or unbounded
            frames[-1][2][-1] += pattern[opened:i]  # the whole group, for comparing alternatives
            continue
        else:
            i += 1
        _, unbounded, i = _quantifier(pattern, i)
        frames[-1][0] = frames[-1][0] or unbounded
        frames[-1][2][-1] += pattern[start:i]
    return None


_HINT = (
    "it can backtrack exponentially on a short string; write the group atomic (?>...) or the "
    "inner repeat possessive (a++), or simplify it"
)


def _quantifier(pattern: str, i: int) -> tuple[bool, bool, int]:
    """At `i`: (repeats 10+ times or without bound, repeats without bound, index after it).
    A possessive quantifier (a trailing +) never backtracks, so it counts as neither."""
    m = _QUANT.match(pattern, i)
    if m is None:
        return False, False, i
    end = m.end()
    possessive = end < len(pattern) and pattern[end] == "+"
    if end < len(pattern) and pattern[end] in "+?":
        end += 1
    token = m.group(0)
    if token in ("*", "+"):
        unbounded, most = True, None
    elif token == "?":
        unbounded, most = False, 1
    else:
        low, comma, high = m.group(1), m.group(2), m.group(3)
        unbounded = bool(comma) and not high
        most = None if unbounded else int(high if comma else low or 0)
    if possessive:
        return False, False, end
    return unbounded or (most is not None and most >= 10), unbounded, end


def _overlapping(branches: list[str]) -> bool:
    """Whether one alternative's text is a prefix of another's ((a|a), (a|ab), (|a))."""
    if len(branches) < 2:
        return False
    ordered = sorted(branches)
    return any(b.startswith(a) for a, b in zip(ordered, ordered[1:], strict=False))


# --- the validator -----------------------------------------------------------------------------


class BodyValidator:
    """Validates bodies for one message type; built once per type so schemas compile once."""

    def __init__(self, mt: Validated, strict: bool = True) -> None:
        self.name = mt.name
        self.kind = mt.validation
        self._schema = None
        if mt.validation == "json_schema":
            self._schema = compile_schema(mt.name, mt.schema, strict)

    def check(self, body: bytes) -> None:
        kind = self.kind
        if kind == "none":
            return
        if kind == "empty":
            if body:
                self._fail(f"must be empty, got {len(body)} bytes")
            return
        if kind == "msgpack":
            try:
                msgpack.unpackb(body, raw=False, strict_map_key=False)
            except Exception as exc:  # msgpack raises several unrelated types
                self._fail(f"is not well-formed msgpack ({exc})")
            return
        if self._schema is not None and len(body) > MAX_SCHEMA_BODY_BYTES:
            self._fail(
                f"is {len(body):,} bytes; a body checked by a JSON schema may be at most "
                f"{MAX_SCHEMA_BODY_BYTES:,} bytes (use validation 'json' for larger ones)"
            )
        doc, why = parse_json(body)
        if why is not None:
            self._fail(why)
        if self._schema is not None:
            try:
                err = next(iter(self._schema.iter_errors(doc)), None)
            except RecursionError:
                self._fail("nests too deeply for its JSON schema to check")
            except Exception as exc:  # the schema library failed, not the body: still refused
                self._fail(f"could not be checked against its JSON schema ({type(exc).__name__})")
            if err is not None:
                where = "/".join(str(p) for p in err.absolute_path) or "(root)"
                self._fail(f"does not match its JSON schema at {where[:200]}: {err.message[:500]}")

    def _fail(self, why: str) -> NoReturn:
        raise ValidationFailed(f"body of message type {self.name!r} {why}")


def json_data(value: Any) -> bool:
    """Whether `value` is JSON data: None, bools, strings, finite numbers, lists and dicts with
    string keys, nested at most `MAX_DEFINITION_DEPTH` levels."""
    if too_deep(value, MAX_DEFINITION_DEPTH):
        return False
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None or isinstance(item, bool | str | int):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            if not all(isinstance(k, str) for k in item):
                return False
            stack.extend(item.values())
        else:
            return False
    return True


def plain_json_object(value: Any) -> bool:
    """Whether `value` is a dict that JSON carries (string keys, plain values)."""
    return isinstance(value, dict) and json_data(value)
