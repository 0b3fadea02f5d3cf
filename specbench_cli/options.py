"""`--opt` strings read into a method's `Options`: `key=value` pairs typed and range-checked before any model
loads, a routed method's proposers' options written `NAME.key=value` (the flat `key=value` of the previous
release still reaches the one proposer that has `key`, with a deprecation note), and Options written back as
run.json records them. Torch-free, so `specbench run` answers a bad option before it imports torch."""

from __future__ import annotations

import dataclasses
import math

from specbench_cli.core.errors import UsageError, unknown
from specbench_cli.core.options import nested


def parse_options(cls: type, pairs: list[str], notes: list[str] | None = None) -> object:
    """Turn `key=value` strings into the typed Options of method class `cls`; unknown keys and bad values are errors.
    A routed method's proposer options are written `NAME.key=value`; the flat `key=value` of the previous
    release still reaches the one proposer that has `key`, with a deprecation line added to `notes`."""
    return parse_into(cls.name, cls.Options(), pairs, "", notes if notes is not None else [])


def parse_into(name: str, base: object, pairs: list[str], prefix: str, notes: list[str]) -> object:
    """`base` (an Options-like dataclass) with `pairs` applied, typed and range-checked; `name` and `prefix`
    (how the user wrote the keys) are for the messages."""
    fields = {f.name: f for f in dataclasses.fields(base)}
    subs = {n: {f.name for f in dataclasses.fields(sub)} for n, sub in nested(type(base)).items()}
    inner: dict[str, list[str]] = {n: [] for n in subs}
    values: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise UsageError(f"malformed --opt '{prefix}{pair}': expected key=value")
        head, dot, rest = key.partition(".")
        if dot and head in inner:
            inner[head].append(f"{rest}={raw}")
            continue
        owners = [n for n, keys in subs.items() if key in keys]
        if key not in fields and len(owners) == 1:
            notes.append(f"note: --opt {key}= is deprecated for {name} and will be removed in the next release; "
                         f"write --opt {owners[0]}.{key}=")
            inner[owners[0]].append(f"{key}={raw}")
            continue
        if key not in fields or key in inner:
            known = option_names(type(base))
            raise unknown(f"option for {name}", prefix + key, known) if known else UsageError(f"method {name} takes no --opt (got '{key}')")
        values[key] = _convert(prefix + key, raw.strip(), fields[key].type)
    for sub, sub_pairs in inner.items():
        if sub_pairs:
            values[sub] = parse_into(name, getattr(base, sub), sub_pairs, f"{prefix}{sub}.", notes)
    options = dataclasses.replace(base, **values)  # an Options' __post_init__ checks what involves two fields
    check_ranges(name, options, prefix)
    return options


def option_names(options_cls: type) -> list[str]:
    """Every key `--opt` accepts for an Options class, a proposer's as NAME.key."""
    subs = nested(options_cls)
    return [n for f in dataclasses.fields(options_cls)
            for n in ([f"{f.name}.{k}" for k in option_names(subs[f.name])] if f.name in subs else [f.name])]


def options_record(options: object) -> dict:
    """Options as run.json records them: a flat mapping, a proposer's options under NAME.key."""
    record = {}
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.metadata.get("proposer"):
            record.update({f"{f.name}.{k}": v for k, v in options_record(value).items()})
        else:
            record[f.name] = value
    return record


def check_ranges(name: str, options: object, prefix: str = "") -> None:
    """Every number of an Options within the range its `RANGES` declares ((low, high), None = unbounded), and
    finite; NaN only where NaN is the default ("use the calibrated value"). A proposer's options by its own
    RANGES."""
    ranges: dict = getattr(options, "RANGES", {})
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if f.metadata.get("proposer"):
            check_ranges(name, value, f"{prefix}{f.name}.")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isnan(value) and isinstance(f.default, float) and math.isnan(f.default):
            continue
        low, high = ranges[f.name]  # a KeyError here is a method that forgot to declare a range (a test checks)
        if not (math.isfinite(value) and (low is None or value >= low) and (high is None or value <= high)):
            bounds = " and ".join(b for b in (low is not None and f">= {low:g}", high is not None and f"<= {high:g}") if b)
            raise UsageError(f"--opt {prefix}{f.name}={value:g} is out of range for {name}: it must be "
                             f"{bounds or 'a finite number'}")


def _convert(key: str, raw: str, typ: object) -> object:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return raw.lower() in ("true", "1", "yes")
        if name == "int":
            return int(raw)
        if name == "float":
            return float(raw)
        return raw
    except ValueError:
        raise UsageError(f"bad value for --opt {key}: '{raw}' is not a {name}") from None


def default_texts(options_cls: type) -> dict[str, str]:
    """How `run --list` shows a default that stands in for something else (`DEFAULT_TEXT`), a proposer's under
    NAME.key."""
    texts = dict(getattr(options_cls, "DEFAULT_TEXT", {}))
    for name, sub in nested(options_cls).items():
        texts.update({f"{name}.{k}": v for k, v in default_texts(sub).items()})
    return texts
