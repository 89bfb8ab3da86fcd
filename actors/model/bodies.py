"""Body validation for message types, bounded so that no body or schema can make it crash or hang.

Plain Python, no Ray. A `BodyValidator` is built once per message type (a schema compiles once) and
checks every body of that type. The bounds, all documented in docs/concepts.md:

- JSON bodies ("json", "json_schema") nest at most `MAX_BODY_DEPTH` arrays/objects and hold no
  NaN or Infinity (they are not JSON);
- a "json_schema" body is at most `MAX_SCHEMA_BODY_BYTES`: schema checks (regexes above all) cost
  more per byte than parsing;
- a schema must have every `$ref` resolvable within itself (nothing is fetched), and its regexes
  (`pattern`, `patternProperties`) run on RE2, whose time is linear in the text: no body can make
  one backtrack. A regex RE2 cannot run (a backreference, a lookaround, an atomic group, a
  possessive repeat) is refused at create;
- any failure of the schema library while checking a body is `ValidationFailed`, never a raw
  exception.
"""

from __future__ import annotations

import functools
import json
import math
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
        elif isinstance(item, (list, tuple)):
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


# One decoder for every body: `json.loads` with any option builds a new decoder (and its
# scanner) per call, which was a third of the cost of checking a small body.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


_NOT_PLAIN = frozenset(b"\x00\xef\xfe\xff")  # a first byte of a BOM, or a zero
_SCAN = _DECODER.scan_once  # the C scanner `decode` calls, after two whitespace matches
_SPACE = " \t\n\r"  # JSON's whitespace


def _loads(body: bytes) -> Any:
    """`json.loads(body, parse_constant=_no_constants)`, with the one decoder."""
    if isinstance(body, (bytes, bytearray)):
        # json.detect_encoding's answer is UTF-8 unless a BOM or a zero byte leads: most bodies
        # are told so without calling it
        plain = body and body[0] not in _NOT_PLAIN and (len(body) < 2 or body[1])
        text = body.decode("utf-8" if plain else json.detect_encoding(body), "surrogatepass")
        if text and text[0] not in _SPACE and text[-1] not in _SPACE:
            # most bodies: no whitespace around the value, scanned at once (anything else, and
            # any error, as `decode` has it, so its message names what is wrong)
            try:
                doc, end = _SCAN(text, 0)
            except StopIteration:
                end = -1
            if end == len(text):
                return doc
        return _DECODER.decode(text)
    return json.loads(body, parse_constant=_no_constants)  # what json makes of anything else


def parse_json(body: bytes) -> tuple[Any, str | None]:
    """(document, None), or (None, why it is not an acceptable JSON body)."""
    try:
        doc = _loads(body)
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
    cls = _linear_keywords(jsonschema.validators.validator_for(schema))
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
            why = regex_refusal(text)
            if why:
                raise refuse(f"{kind} {shown(text)} {why}")
    except InvalidDefinition:
        raise
    except Exception as exc:  # referencing raises several unrelated types
        raise refuse(
            f"a $ref cannot be resolved within the schema ({exc}); define what it names "
            "under $defs (nothing is fetched from elsewhere)"
        ) from None
    why = _regex_keywords_elsewhere(schema)
    if why:
        raise refuse(why)
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


def regex_refusal(pattern: str) -> str | None:
    """Why a schema regex may not be used, or None: RE2 cannot compile it."""
    try:
        _re2(pattern)
    except Exception as exc:  # re2.error, and TypeError for what is not a str
        return (
            f"cannot run in linear time ({exc}); schema regexes run on RE2, without "
            "backreferences, lookarounds, atomic groups or possessive repeats"
        )
    return None


@functools.lru_cache(maxsize=1024)
def _re2(pattern: str) -> Any:
    import re2  # google-re2: linear-time matching, whatever the text

    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options)


def _search(pattern: str, text: str) -> bool:
    return _re2(pattern).search(text) is not None


def _linear_keywords(cls: Any) -> Any:
    """`cls` with every keyword that runs a regex on a body running it on RE2 (jsonschema's own
    run Python's backtracking `re`)."""
    import jsonschema
    from jsonschema.exceptions import ValidationError

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not _search(patrn, instance):
            yield ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(validator: Any, props: Any, instance: Any, schema: Any) -> Iterator:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in props.items():
            for key, value in instance.items():
                if _search(patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    def additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator:
        if not validator.is_type(instance, "object"):
            return
        known, patterns = schema.get("properties", {}), list(schema.get("patternProperties", {}))
        extras = [
            k for k in instance if k not in known and not any(_search(p, k) for p in patterns)
        ]
        if validator.is_type(ap, "object"):
            for extra in extras:
                yield from validator.descend(instance[extra], ap, path=extra)
        elif not ap and extras:
            shown_ = ", ".join(repr(k) for k in sorted(extras)[:20])
            yield ValidationError(f"Additional properties are not allowed ({shown_} unexpected)")

    return jsonschema.validators.extend(
        cls,
        {
            "pattern": pattern,
            "patternProperties": pattern_properties,
            "additionalProperties": additional_properties,
        },
    )


def _regex_keywords_elsewhere(schema: Any) -> str | None:
    """A keyword that would run a schema regex through jsonschema's own code (Python's `re`)."""
    texts = json.dumps(schema)
    if '"unevaluatedProperties"' in texts and '"patternProperties"' in texts:
        return (
            "unevaluatedProperties beside patternProperties is not supported (it would match "
            "keys with a backtracking regex engine); use additionalProperties"
        )
    return None


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
        if item is None or isinstance(item, (bool, str, int)):
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
