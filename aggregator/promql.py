"""The PromQL subset the query API understands, parsed into a tiny AST.

Grammar (whitespace free-form)::

    expr      := aggregate | selector
    aggregate := OP [grouping] "(" [NUMBER ","] expr ")" [grouping]
    OP        := sum | avg | min | max | quantile        (quantile takes the NUMBER)
    grouping  := ("by" | "without") "(" [label ("," label)*] ")"
    selector  := [metric_name] ["{" [matcher ("," matcher)*] [","] "}"]
    matcher   := label ("=" | "!=" | "=~" | "!~") STRING

Errors raise :class:`PromQLError` with the position, which the HTTP layer returns as
Prometheus' ``bad_data`` error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["Aggregate", "PromQLError", "Selector", "parse"]

AGG_OPS: Final = ("sum", "avg", "min", "max", "quantile")
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>=~|!~|!=|=|\{|\}|\(|\)|,)
""", re.X)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


class PromQLError(ValueError):
    """A query that is not in the supported subset; the message says where and why."""


@dataclass(frozen=True, slots=True)
class Selector:
    matchers: tuple[tuple[str, str, str], ...]
    """(label, op, value); the metric name is the matcher on ``__name__``."""


@dataclass(frozen=True, slots=True)
class Aggregate:
    op: str
    expr: Selector | Aggregate
    by: tuple[str, ...] | None = None
    without: tuple[str, ...] | None = None
    param: float | None = None


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise PromQLError(f"unexpected character {text[pos]!r} at position {pos}")
            kind = m.lastgroup or ""
            if kind != "ws":
                self.toks.append((kind, m.group(), pos))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.toks[self.i] if self.i < len(self.toks) else ("eof", "", len(self.text))

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        k, v, pos = self.peek()
        if (value is not None and v != value) or (kind is not None and k != kind):
            want = value or kind
            got = v or "end of query"
            raise PromQLError(f"expected {want!r} at position {pos}, found {got!r}")
        self.i += 1
        return v

    def expr(self) -> Selector | Aggregate:
        kind, value, _ = self.peek()
        nxt = self.toks[self.i + 1][1] if self.i + 1 < len(self.toks) else ""
        if kind == "ident" and value in AGG_OPS and nxt in ("(", "by", "without"):
            return self.aggregate()
        return self.selector()

    def grouping(self) -> tuple[str, tuple[str, ...]] | None:
        kind, value, _ = self.peek()
        if kind != "ident" or value not in ("by", "without"):
            return None
        self.i += 1
        self.take("(")
        labels: list[str] = []
        while self.peek()[1] != ")":
            labels.append(self.take(kind="ident"))
            if self.peek()[1] == ",":
                self.i += 1
        self.take(")")
        return value, tuple(labels)

    def aggregate(self) -> Aggregate:
        op = self.take(kind="ident")
        g = self.grouping()
        self.take("(")
        param = None
        if op == "quantile":
            param = float(self.take(kind="num"))
            if not 0.0 <= param <= 1.0:
                raise PromQLError(f"quantile must be within [0, 1], got {param}")
            self.take(",")
        inner = self.expr()
        self.take(")")
        g2 = self.grouping()
        if g and g2:
            raise PromQLError("grouping given twice")
        g = g or g2
        by = g[1] if g and g[0] == "by" else None
        without = g[1] if g and g[0] == "without" else None
        return Aggregate(op, inner, by, without, param)

    def selector(self) -> Selector:
        matchers: list[tuple[str, str, str]] = []
        kind, value, pos = self.peek()
        if kind == "ident":
            self.i += 1
            matchers.append(("__name__", "=", value))
        if self.peek()[1] == "{":
            self.i += 1
            while self.peek()[1] != "}":
                label = self.take(kind="ident")
                _k, op, p = self.peek()
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"expected a matcher operator at position {p}")
                self.i += 1
                value = _unquote(self.take(kind="str"))
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise PromQLError(f"invalid regular expression {value!r}: {exc}") from None
                matchers.append((label, op, value))
                if self.peek()[1] == ",":
                    self.i += 1
                elif self.peek()[1] != "}":
                    raise PromQLError(f"expected ',' or '}}' at position {self.peek()[2]}")
            self.take("}")
        if not matchers:
            raise PromQLError(f"expected a metric name or selector at position {pos}")
        if all(op in ("!=", "!~") or (op == "=~" and re.fullmatch(v, "")) for _, op, v in matchers):
            raise PromQLError("vector selector must contain at least one non-empty matcher")
        return Selector(tuple(matchers))


def parse(text: str) -> Selector | Aggregate:
    """Parse ``text`` or raise PromQLError."""
    if not text.strip():
        raise PromQLError("empty query")
    p = _Parser(text)
    try:
        e = p.expr()
    except re.error as exc:
        raise PromQLError(f"invalid regular expression: {exc}") from None
    if p.peek()[0] != "eof":
        raise PromQLError(f"unexpected {p.peek()[1]!r} at position {p.peek()[2]}")
    return e
