#!/usr/bin/env python3
"""Build the portable edition of dedup from the native install script.

    python3 scripts/portable.py NATIVE_SCRIPT VERSION OUTDIR

NATIVE_SCRIPT is the script pgrx generates from src/*.rs (dedup--VERSION.sql). Every
statement of it is kept as it is, except each `CREATE FUNCTION ... LANGUAGE c`, which is
replaced by the function of the same name and argument types in sql/portable/*.sql. The
build fails (exit status 1, every problem listed) when a C function has no portable
counterpart, when a portable function matches no C function, or when their headers differ
(argument names, types and defaults, the return type, STRICT, volatility, PARALLEL,
SECURITY DEFINER, SET, LEAKPROOF, COST, ROWS). Functions named _portable_* are the portable
edition's own helpers: they, and the COMMENT, GRANT and REVOKE statements about them, are
put before the first function replaced.

Written to OUTDIR:
  dedup--VERSION.sql   the extension script of the portable edition;
  dedup.pgtle.sql      its registration with pg_tle (pgtle.install_extension);
  dedup.plain.sql      one DO statement that creates the same objects in the schema dedup
                       without an extension: re-running it is a no-op with a NOTICE;
  dedup.to-native.sql  one DO statement that moves a database from the portable edition
                       (either install) to the native extension of VERSION, every row kept:
                       it drops what dedup.plain.sql made by name (RESTRICT), so the build
                       fails on a statement of the script whose objects it cannot name.

The portable edition starts at 0.6.0 and has no update path yet: the first version after
it adds one (a pg_tle update path, a step of the plain script) made from the native
upgrade script with the same replacements.

Python 3 standard library only.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

EXTENSION = "dedup"
SCHEMA = "dedup"
HELPER_PREFIX = "_portable_"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildError(Exception):
    """A problem the build reports and stops on."""


# --- Splitting SQL ---------------------------------------------------------------------

_IDENT_CHAR = re.compile(r"[A-Za-z0-9_$\x80-\U0010ffff]")
_DOLLAR_TAG = re.compile(r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")


@dataclass
class Token:
    kind: str  # word, qident, string, dollar, number, op, param
    text: str  # as written
    value: str  # words lowercased, identifiers and strings unquoted


def _skip_block_comment(sql: str, i: int) -> int:
    """i is at '/*'; returns the index after the matching '*/' (comments nest)."""
    depth = 0
    n = len(sql)
    while i < n:
        if sql.startswith("/*", i):
            depth += 1
            i += 2
        elif sql.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise BuildError("unterminated /* comment")


def _end_of_quoted(sql: str, i: int, quote: str, backslashes: bool) -> int:
    """i is at the opening quote; returns the index after the closing one."""
    n = len(sql)
    i += 1
    while i < n:
        c = sql[i]
        if backslashes and c == "\\":
            i += 2
            continue
        if c == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    raise BuildError(f"unterminated {quote}-quoted text")


def _dollar_at(sql: str, i: int) -> str | None:
    """The dollar-quote tag starting at i ('$$' or '$tag$'), if one starts there."""
    if i > 0 and _IDENT_CHAR.match(sql[i - 1]):
        return None  # part of an identifier such as a$b
    m = _DOLLAR_TAG.match(sql, i)
    return m.group(0) if m else None


def lex(sql: str):
    """Yield (start, end, kind) for every lexical item of sql, comments included.

    kind is one of: comment, ws, string, qident, dollar, word, number, param, op, semicolon.
    """
    i = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if c.isspace():
            j = i
            while j < n and sql[j].isspace():
                j += 1
            yield i, j, "ws"
            i = j
        elif sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j
            yield i, j, "comment"
            i = j
        elif sql.startswith("/*", i):
            j = _skip_block_comment(sql, i)
            yield i, j, "comment"
            i = j
        elif c == "'":
            prefix_e = i > 0 and sql[i - 1] in "eE" and not (i > 1 and _IDENT_CHAR.match(sql[i - 2]))
            j = _end_of_quoted(sql, i, "'", prefix_e)
            yield i, j, "string"
            i = j
        elif c == '"':
            j = _end_of_quoted(sql, i, '"', False)
            yield i, j, "qident"
            i = j
        elif c == "$":
            tag = _dollar_at(sql, i)
            if tag:
                j = sql.find(tag, i + len(tag))
                if j < 0:
                    raise BuildError(f"unterminated dollar quote {tag}")
                yield i, j + len(tag), "dollar"
                i = j + len(tag)
            else:
                j = i + 1
                while j < n and sql[j].isdigit():
                    j += 1
                yield i, max(j, i + 1), "param"
                i = max(j, i + 1)
        elif c == ";":
            yield i, i + 1, "semicolon"
            i += 1
        elif c.isdigit():
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "."):
                j += 1
            yield i, j, "number"
            i = j
        elif _IDENT_CHAR.match(c):
            j = i
            while j < n and _IDENT_CHAR.match(sql[j]):
                j += 1
            # E'...' strings: the E is lexed with its string.
            if j == i + 1 and c in "eE" and j < n and sql[j] == "'":
                i = j
                continue
            yield i, j, "word"
            i = j
        elif sql.startswith("::", i):
            yield i, i + 2, "op"
            i += 2
        else:
            yield i, i + 1, "op"
            i += 1


@dataclass
class Statement:
    text: str  # as written, with the comments before it, up to and including its ';'
    tokens: list[Token]  # without comments and whitespace
    source: str  # where it comes from, for messages

    @property
    def code(self) -> str:
        return " ".join(t.text for t in self.tokens)


def _token(sql: str, start: int, end: int, kind: str) -> Token:
    text = sql[start:end]
    if kind == "word":
        return Token("word", text, text.lower())
    if kind == "qident":
        return Token("qident", text, text[1:-1].replace('""', '"'))
    if kind == "string":
        body = text[text.index("'") + 1 : -1]
        return Token("string", text, body.replace("''", "'"))
    if kind == "dollar":
        tag = _DOLLAR_TAG.match(text).group(0)
        return Token("dollar", text, text[len(tag) : -len(tag)])
    return Token(kind, text, text)


def split_statements(sql: str, source: str) -> tuple[list[Statement], str]:
    """The statements of sql, and the text after the last one (comments, whitespace)."""
    out: list[Statement] = []
    start = 0
    tokens: list[Token] = []
    for s, e, kind in lex(sql):
        if kind in ("ws", "comment"):
            continue
        if kind == "semicolon":
            if tokens:
                out.append(Statement(sql[start:e], tokens, source))
            else:
                # An empty statement: keep its text with the next one.
                continue
            tokens = []
            start = e
            continue
        tokens.append(_token(sql, s, e, kind))
    rest = sql[start:]
    if tokens:
        raise BuildError(f"{source}: the last statement has no ';': {' '.join(t.text for t in tokens)[:120]}")
    return out, rest


def code_without_comments(sql: str) -> str:
    """sql with its comments removed (strings and quoted bodies kept)."""
    return "".join(sql[s:e] if kind != "comment" else " " for s, e, kind in lex(sql))


# --- Function headers ------------------------------------------------------------------

_TYPE_ALIASES = {
    "int": "int4", "integer": "int4", "int4": "int4",
    "bigint": "int8", "int8": "int8",
    "smallint": "int2", "int2": "int2",
    "bool": "bool", "boolean": "bool",
    "real": "float4", "float4": "float4",
    "double precision": "float8", "float8": "float8",
    "timestamp with time zone": "timestamptz", "timestamptz": "timestamptz",
    "timestamp without time zone": "timestamp", "timestamp": "timestamp",
    "time with time zone": "timetz", "timetz": "timetz",
    "time without time zone": "time", "time": "time",
    "character varying": "varchar", "varchar": "varchar",
    "character": "bpchar", "char": "bpchar",
    "decimal": "numeric",
}
_MULTIWORD_TYPE_START = {"double", "timestamp", "time", "character", "bit", "national"}
_MULTIWORD_TYPE_CONT = {"precision", "with", "without", "time", "zone", "varying", "character"}
_ARG_MODES = {"in", "out", "inout", "variadic"}


def _split_top_level(tokens: list[Token], sep: str = ",") -> list[list[Token]]:
    parts: list[list[Token]] = [[]]
    depth = 0
    for t in tokens:
        if t.kind == "op" and t.text in "([":
            depth += 1
        elif t.kind == "op" and t.text in ")]":
            depth -= 1
        if depth == 0 and t.kind == "op" and t.text == sep:
            parts.append([])
        else:
            parts[-1].append(t)
    return [p for p in parts if p] if any(parts) else []


def _matching_paren(tokens: list[Token], i: int) -> int:
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].kind == "op" and tokens[j].text == "(":
            depth += 1
        elif tokens[j].kind == "op" and tokens[j].text == ")":
            depth -= 1
            if depth == 0:
                return j
    raise BuildError("unbalanced parentheses")


def normalize_type(tokens: list[Token]) -> str:
    """pg_catalog.text, TEXT and text are one type; so are bigint and int8."""
    words: list[str] = []
    suffix = ""
    toks = list(tokens)
    # A schema qualification: drop pg_catalog (the native script's types are built-in).
    if len(toks) >= 3 and toks[1].kind == "op" and toks[1].text == ".":
        if toks[0].value != "pg_catalog":
            words.append(toks[0].value + ".")
        toks = toks[2:]
    for t in toks:
        if t.kind == "op" and t.text in ("[", "]"):
            suffix += t.text
        elif t.kind == "op" and t.text in ("(", ")", ","):
            suffix += t.text
        elif t.kind == "number":
            suffix += t.text
        else:
            words.append(t.value)
    name = " ".join(w for w in words if not w.endswith("."))
    prefix = "".join(w for w in words if w.endswith("."))
    name = _TYPE_ALIASES.get(name, name)
    # "text []" and "text[]" alike; a declared array size means nothing to PostgreSQL.
    suffix = re.sub(r"\[\d*\]", "[]", suffix.replace(" ", ""))
    return prefix + name + suffix


def _normalize_expr(tokens: list[Token], arg_type: str | None) -> str:
    """A default's expression, comparable: keywords lowercased, a final cast to the
    argument's own type dropped ('default'::text is 'default' for a text argument)."""
    toks = list(tokens)
    for k in range(len(toks)):
        if toks[k].kind == "op" and toks[k].text == "::":
            if normalize_type(toks[k + 1 :]) == arg_type:
                toks = toks[:k]
            break
    parts = []
    for t in toks:
        if t.kind == "word":
            parts.append(t.value)
        elif t.kind in ("string", "dollar"):
            parts.append("'" + t.value.replace("'", "''") + "'")
        elif t.kind == "qident":
            parts.append('"' + t.value + '"')
        else:
            parts.append(t.text)
    return " ".join(parts)


@dataclass
class Arg:
    mode: str
    name: str | None
    type: str
    default: str | None

    def show(self) -> str:
        s = f"{self.mode} " if self.mode != "in" else ""
        s += f"{self.name} " if self.name else ""
        s += self.type
        if self.default is not None:
            s += f" DEFAULT {self.default}"
        return s


def _parse_arg(tokens: list[Token]) -> Arg:
    toks = list(tokens)
    mode = "in"
    if toks and toks[0].kind == "word" and toks[0].value in _ARG_MODES:
        mode = toks[0].value
        toks = toks[1:]
    default = None
    for k, t in enumerate(toks):
        if (t.kind == "word" and t.value == "default") or (t.kind == "op" and t.text == "="):
            default = toks[k + 1 :]
            toks = toks[:k]
            break
    name = None
    if len(toks) >= 2 and toks[0].kind in ("word", "qident"):
        first, second = toks[0], toks[1]
        multiword = (
            first.kind == "word"
            and first.value in _MULTIWORD_TYPE_START
            and second.kind == "word"
            and second.value in _MULTIWORD_TYPE_CONT
        )
        qualified = second.kind == "op" and second.text == "."
        array_or_mod = second.kind == "op" and second.text in ("[", "(")
        if not (multiword or qualified or array_or_mod):
            name = first.value
            toks = toks[1:]
    typ = normalize_type(toks)
    return Arg(mode, name, typ, _normalize_expr(default, typ) if default is not None else None)


@dataclass
class Function:
    name: str
    args: list[Arg]
    returns: str
    attrs: dict[str, str]
    language: str
    statement: Statement
    or_replace: bool = False

    @property
    def input_types(self) -> tuple[str, ...]:
        return tuple(a.type for a in self.args if a.mode in ("in", "inout", "variadic"))

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.name, self.input_types)

    def signature(self) -> str:
        return f"{SCHEMA}.{self.name}({', '.join(self.input_types)})"


def _word(t: Token, *values: str) -> bool:
    return t.kind == "word" and t.value in values


def parse_function(st: Statement) -> Function | None:
    """The header of a CREATE FUNCTION statement; None for any other statement."""
    toks = st.tokens
    i = 0
    if not (len(toks) > 2 and _word(toks[0], "create")):
        return None
    i = 1
    or_replace = False
    if _word(toks[i], "or") and _word(toks[i + 1], "replace"):
        or_replace = True
        i += 2
    if not _word(toks[i], "function"):
        return None
    i += 1
    # The name: [schema .] name
    parts = []
    while True:
        parts.append(toks[i].value)
        i += 1
        if toks[i].kind == "op" and toks[i].text == ".":
            i += 1
            continue
        break
    if len(parts) == 2 and parts[0] != SCHEMA:
        raise BuildError(f"{st.source}: function {'.'.join(parts)} is not in the schema {SCHEMA}")
    name = parts[-1]
    if not (toks[i].kind == "op" and toks[i].text == "("):
        raise BuildError(f"{st.source}: cannot read the arguments of {name}")
    close = _matching_paren(toks, i)
    args = [_parse_arg(a) for a in _split_top_level(toks[i + 1 : close])]
    i = close + 1

    returns = None
    attrs: dict[str, str] = {
        "strict": "called on null input",
        "volatility": "volatile",
        "parallel": "unsafe",
        "security": "invoker",
        "leakproof": "not leakproof",
    }
    sets: list[str] = []
    language = None
    n = len(toks)
    while i < n:
        t = toks[i]
        if _word(t, "returns"):
            if _word(toks[i + 1], "null"):  # RETURNS NULL ON NULL INPUT
                attrs["strict"] = "strict"
                i += 5
                continue
            if _word(toks[i + 1], "table"):
                close = _matching_paren(toks, i + 2)
                cols = [_parse_arg(c) for c in _split_top_level(toks[i + 3 : close])]
                returns = "table(" + ", ".join(f"{c.name} {c.type}" for c in cols) + ")"
                i = close + 1
                continue
            j = i + 1
            setof = False
            if _word(toks[j], "setof"):
                setof = True
                j += 1
            k = j
            while k < n and not _is_option_start(toks, k):
                k += 1
            returns = ("setof " if setof else "") + normalize_type(toks[j:k])
            i = k
        elif _word(t, "language"):
            language = toks[i + 1].value
            i += 2
        elif _word(t, "as"):
            i += 2
            while i < n and toks[i].kind == "op" and toks[i].text == ",":
                i += 2
        elif _word(t, "strict"):
            attrs["strict"] = "strict"
            i += 1
        elif _word(t, "called"):  # CALLED ON NULL INPUT
            attrs["strict"] = "called on null input"
            i += 4
        elif _word(t, "immutable", "stable", "volatile"):
            attrs["volatility"] = t.value
            i += 1
        elif _word(t, "parallel"):
            attrs["parallel"] = toks[i + 1].value
            i += 2
        elif _word(t, "external"):
            i += 1
        elif _word(t, "security"):
            attrs["security"] = toks[i + 1].value
            i += 2
        elif _word(t, "leakproof"):
            attrs["leakproof"] = "leakproof"
            i += 1
        elif _word(t, "not") and _word(toks[i + 1], "leakproof"):
            attrs["leakproof"] = "not leakproof"
            i += 2
        elif _word(t, "cost", "rows"):
            attrs[t.value] = toks[i + 1].text
            i += 2
        elif _word(t, "window"):
            attrs["window"] = "window"
            i += 1
        elif _word(t, "support"):
            attrs["support"] = toks[i + 1].value
            i += 2
        elif _word(t, "set"):
            guc = toks[i + 1].value
            j = i + 2
            if _word(toks[j], "from"):  # SET x FROM CURRENT
                sets.append(f"{guc} from current")
                i = j + 2
                continue
            j += 1  # TO or =
            values = []
            while j < n and not _is_option_start(toks, j):
                if not (toks[j].kind == "op" and toks[j].text == ","):
                    values.append(toks[j].value)
                j += 1
            sets.append(f"{guc} = {', '.join(values)}")
            i = j
        else:
            raise BuildError(f"{st.source}: function {name}: cannot read {t.text!r} in its header")
    if returns is None:
        # Only OUT arguments: RETURNS record is implied.
        returns = "record"
    outs = [a for a in args if a.mode in ("out", "inout")]
    if outs and returns in ("record", "setof record"):
        cols = "(" + ", ".join(f"{a.name} {a.type}" for a in outs) + ")"
        returns = ("table" if returns.startswith("setof") else "record") + cols
        args = [a for a in args if a.mode != "out"]
    attrs["set"] = "; ".join(sorted(sets))
    if language is None:
        raise BuildError(f"{st.source}: function {name} has no LANGUAGE")
    return Function(name, args, returns, attrs, language, st, or_replace)


_OPTION_WORDS = {
    "language", "as", "strict", "called", "immutable", "stable", "volatile", "parallel",
    "external", "security", "leakproof", "cost", "rows", "window", "support", "set", "returns",
}


def _is_option_start(toks: list[Token], k: int) -> bool:
    t = toks[k]
    if t.kind != "word":
        return False
    if t.value == "not" and k + 1 < len(toks) and _word(toks[k + 1], "leakproof"):
        return True
    return t.value in _OPTION_WORDS


def header_differences(native: Function, portable: Function) -> list[str]:
    diffs = []
    if len(native.args) != len(portable.args):
        diffs.append(
            f"arguments: native ({', '.join(a.show() for a in native.args)}), "
            f"portable ({', '.join(a.show() for a in portable.args)})"
        )
    else:
        for k, (a, b) in enumerate(zip(native.args, portable.args), 1):
            if a != b:
                diffs.append(f"argument {k}: native {a.show()}, portable {b.show()}")
    if native.returns != portable.returns:
        diffs.append(f"returns: native {native.returns}, portable {portable.returns}")
    for k in sorted(set(native.attrs) | set(portable.attrs)):
        a, b = native.attrs.get(k, ""), portable.attrs.get(k, "")
        if a != b:
            diffs.append(f"{k}: native {a or '(none)'}, portable {b or '(none)'}")
    return diffs


# --- The portable sources ---------------------------------------------------------------


@dataclass
class PortableSources:
    replacements: dict[tuple[str, tuple[str, ...]], Function] = field(default_factory=dict)
    support: list[Statement] = field(default_factory=list)


def read_portable(directory: str) -> PortableSources:
    src = PortableSources()
    problems = []
    files = sorted(f for f in os.listdir(directory) if f.endswith(".sql"))
    if not files:
        raise BuildError(f"no .sql files in {directory}")
    for fname in files:
        path = os.path.join(directory, fname)
        with open(path, encoding="utf-8") as fh:
            statements, _ = split_statements(fh.read(), os.path.relpath(path, REPO))
        for st in statements:
            fn = parse_function(st)
            if fn is None:
                # Only statements about the helpers (COMMENT, GRANT, REVOKE ON FUNCTION).
                head = [t.value for t in st.tokens[:3]]
                about_helper = any(
                    t.kind in ("word", "qident") and t.value.startswith(HELPER_PREFIX) for t in st.tokens
                )
                if head[0] in ("comment", "grant", "revoke") and about_helper:
                    src.support.append(st)
                else:
                    problems.append(
                        f"{st.source}: only CREATE FUNCTION, and COMMENT, GRANT or REVOKE on a "
                        f"{HELPER_PREFIX}* helper, belong in sql/portable: {st.code[:100]}"
                    )
                continue
            if fn.language == "c":
                problems.append(f"{st.source}: {fn.signature()} is LANGUAGE c")
            if fn.or_replace:
                problems.append(f"{st.source}: {fn.signature()}: CREATE OR REPLACE would hide a clash; use CREATE")
            if fn.name.startswith(HELPER_PREFIX):
                src.support.append(st)
                continue
            if fn.key in src.replacements:
                problems.append(f"{st.source}: {fn.signature()} is defined twice")
            src.replacements[fn.key] = fn
    if problems:
        raise BuildError("\n".join(problems))
    return src


# --- Building ---------------------------------------------------------------------------


def replace_c_functions(
    native_sql: str, source: str, portable: PortableSources, used: set, problems: list[str],
) -> tuple[str, int]:
    """The native script with each LANGUAGE c function replaced, and how many were; what
    cannot be replaced is added to problems."""
    statements, rest = split_statements(native_sql, source)
    out = []
    replaced = 0
    helpers_placed = False
    for st in statements:
        fn = parse_function(st)
        if fn is None or fn.language != "c":
            out.append(st.text)
            continue
        mine = portable.replacements.get(fn.key)
        if mine is None:
            problems.append(f"{source}: {fn.signature()} is LANGUAGE c and sql/portable/ has no function "
                            f"{SCHEMA}.{fn.name} with these argument types")
            continue
        used.add(fn.key)
        diffs = header_differences(fn, mine)
        if diffs:
            problems.append(f"{fn.signature()}: the headers differ ({mine.statement.source}):\n    "
                            + "\n    ".join(diffs))
            continue
        replaced += 1
        # Keep the native statement's leading comments (which say where it comes from).
        leading = st.text[: len(st.text) - len(st.text.lstrip())]
        comments = _leading_comments(st.text)
        block = ""
        if not helpers_placed:
            helpers_placed = True
            block += "\n-- The portable edition's helpers (sql/portable/helpers.sql).\n"
            for sup in portable.support:
                block += sup.text.strip("\n") + "\n"
        block += leading + comments
        block += f"-- portable edition: {mine.statement.source}\n"
        text = mine.statement.text.strip("\n")
        if fn.or_replace:
            # An update script replaces the function the older version made.
            text = _or_replace(text)
        block += text
        out.append(block)
    return "".join(out) + rest, replaced


def _or_replace(text: str) -> str:
    """A CREATE FUNCTION statement (after its comments) as CREATE OR REPLACE FUNCTION."""
    for s, e, kind in lex(text):
        if kind not in ("comment", "ws"):
            head = re.match(r"CREATE\s+FUNCTION", text[s:], flags=re.I)
            if not head:
                return text
            return text[:s] + "CREATE OR REPLACE FUNCTION" + text[s + head.end():]
    return text


def _leading_comments(text: str) -> str:
    """The comment lines before a statement's first token."""
    lines = []
    for s, e, kind in lex(text):
        if kind == "comment":
            lines.append(text[s:e].strip())
        elif kind != "ws":
            break
    return "".join(line + "\n" for line in lines)


def check_no_module_pathname(sql: str, what: str) -> None:
    if "MODULE_PATHNAME" in sql:
        line = sql[: sql.index("MODULE_PATHNAME")].count("\n") + 1
        raise BuildError(f"{what}: MODULE_PATHNAME is left at line {line}")
    for st in split_statements(sql, what)[0]:
        fn = parse_function(st)
        if fn is not None and fn.language in ("c", "internal"):
            raise BuildError(f"{what}: {fn.signature()} is still LANGUAGE {fn.language}")


def read_control(path: str) -> dict[str, str]:
    control = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            key, _, value = line.partition("=")
            value = value.strip()
            if value.startswith("'") and value.endswith("'"):
                value = value[1:-1].replace("''", "'")
            control[key.strip()] = value
    return control


def sql_literal(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def dollar_quote(body: str, tag: str) -> str:
    if f"${tag}$" in body:
        raise BuildError(f"the text to quote contains ${tag}$")
    return f"${tag}${body}${tag}$"


def build_pgtle(ext_sql: str, version: str, comment: str, requires: list[str]) -> str:
    """pgtle.install_extension; skipped (with a NOTICE) when pg_tle has this version
    already, so the script can run again."""
    for forbidden in ("$_pgtle_o_$", "$_pgtle_i_$"):
        if forbidden in ext_sql:
            raise BuildError(f"pg_tle refuses a script containing {forbidden}")
    req = "NULL" if not requires else "ARRAY[" + ", ".join(sql_literal(r) for r in requires) + "]"
    body = f"""
DECLARE
    known pg_catalog.bool;
    path  pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_extension AS e WHERE e.extname = 'pg_tle') THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = 'dedup.pgtle.sql: the extension pg_tle is not installed in this database',
            HINT = 'Add pg_tle to shared_preload_libraries (on RDS and Aurora: the parameter group), '
                   'then CREATE EXTENSION pg_tle in this database and run this script again.';
    END IF;
    SELECT EXISTS (SELECT FROM pgtle.available_extensions() AS x WHERE x.name = {sql_literal(EXTENSION)})
      INTO known;
    IF NOT known THEN
        PERFORM pgtle.install_extension({sql_literal(EXTENSION)}, {sql_literal(version)}, {sql_literal(comment)},
{dollar_quote(ext_sql, "_pgtle_")},
            {req}, {sql_literal(SCHEMA)});
    ELSIF NOT EXISTS (SELECT FROM pgtle.available_extension_versions() AS x
                       WHERE x.name = {sql_literal(EXTENSION)} AND x.version = {sql_literal(version)}) THEN
        PERFORM pgtle.install_extension_version_sql({sql_literal(EXTENSION)}, {sql_literal(version)},
{dollar_quote(ext_sql, "_pgtle_")});
    ELSE
        RAISE NOTICE 'pg_tle has dedup {version} already; nothing to register';
    END IF;
    -- CREATE EXTENSION dedup installs the newest version registered.
    IF (SELECT x.default_version FROM pgtle.available_extensions() AS x WHERE x.name = {sql_literal(EXTENSION)})
       IS DISTINCT FROM {sql_literal(version)}
       AND {sql_literal(version)} = (SELECT v.version FROM pgtle.available_extension_versions() AS v
                           WHERE v.name = {sql_literal(EXTENSION)}
                           ORDER BY pg_catalog.string_to_array(v.version, '.')::int[] DESC LIMIT 1) THEN
        PERFORM pgtle.set_default_version({sql_literal(EXTENSION)}, {sql_literal(version)});
    END IF;
    PERFORM pg_catalog.set_config('search_path', path, true);
END
"""
    return f"""-- dedup {version}, portable edition: registration with pg_tle (generated by scripts/portable.py).
--
-- Run it (psql -f, or any client: it is one statement) as a member of pgtle_admin, in each
-- database that will use dedup, then:
--     CREATE EXTENSION dedup;            -- installs into the schema dedup
-- Running it again is a no-op with a NOTICE. The portable edition has no update path yet
-- (the first version after 0.6.0 adds one). See docs/portable.md.
DO {dollar_quote(body, "_dedup_pgtle_")};
"""


PLAIN_MARK = "(portable edition, plain install)"


def plain_install_sql(ext_sql: str, what: str) -> str:
    """The extension script turned into plain SQL: no extension context."""
    statements, rest = split_statements(ext_sql, what)
    out = []
    for st in statements:
        words = [t.value for t in st.tokens[:4]]
        if words[:1] == ["select"] and "pg_extension_config_dump" in words:
            # Marks a table whose rows pg_dump dumps with the extension; pg_dump dumps a
            # plain schema's tables with their rows anyway.
            leading = st.text[: len(st.text) - len(st.text.lstrip())]
            out.append(f"{leading}{_leading_comments(st.text)}-- (plain install: {st.code} left out)")
            continue
        out.append(st.text)
    sql = "".join(out) + rest
    sql = sql.replace("@extschema@", SCHEMA)
    code = code_without_comments(sql)
    for needs in ("pg_extension_config_dump", "@extowner@", "ALTER EXTENSION", "MODULE_PATHNAME"):
        if needs.lower() in code.lower():
            raise BuildError(f"{what}: '{needs}' needs an extension; the plain script cannot run it")
    return sql


def build_plain(ext_sql: str, version: str) -> str:
    install = plain_install_sql(ext_sql, f"{EXTENSION}--{version}.sql")
    mark = f"{EXTENSION} {version} {PLAIN_MARK}"
    body = f"""
DECLARE
    target    constant pg_catalog.text := {sql_literal(version)};
    ext       pg_catalog.text;
    owner     pg_catalog.oid;
    note      pg_catalog.text;
    installed pg_catalog.text;
    path      pg_catalog.text := pg_catalog.current_setting('search_path');
BEGIN
    -- The caller's search_path must not change what this block means; it is put back
    -- before the block ends (an error rolls it back with everything else).
    PERFORM pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true);
    -- The extension (native, or through pg_tle) owns the schema dedup: leave it alone.
    SELECT e.extversion INTO ext FROM pg_catalog.pg_extension AS e WHERE e.extname = 'dedup';
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = pg_catalog.format('dedup.plain.sql: the extension dedup (version %s) is installed in this database', ext),
            HINT = 'The plain install is for servers where CREATE EXTENSION dedup is not possible. Keep the '
                   'extension (ALTER EXTENSION dedup UPDATE for a newer version), or move its claims out and '
                   'DROP EXTENSION dedup first.';
    END IF;
    -- Two runs of this script at once: the second stops (any role can take an advisory
    -- lock, so waiting for it could wait for ever).
    IF NOT pg_catalog.pg_try_advisory_xact_lock(pg_catalog.hashtext('dedup.plain.sql')) THEN
        RAISE EXCEPTION USING ERRCODE = '55P03',
            MESSAGE = 'dedup.plain.sql: another session is running this script, or holds its advisory lock',
            HINT = 'Run it again once that session is done.';
    END IF;
    SELECT n.nspowner, pg_catalog.obj_description(n.oid, 'pg_namespace') INTO owner, note
      FROM pg_catalog.pg_namespace AS n WHERE n.nspname = 'dedup';
    IF FOUND THEN
        installed := pg_catalog.substring(note, '^dedup ([0-9][0-9A-Za-z.\\-]*) \\(portable edition, plain install\\)$');
        IF installed IS NULL THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = 'dedup.plain.sql: a schema dedup exists that this script did not make',
                DETAIL = pg_catalog.format('Its comment is %L; a plain install of dedup records its version there.', note),
                HINT = 'Rename or drop that schema (after moving anything of value out of it), then run this script again.';
        END IF;
        -- Only its owner's: a schema that merely looks like a plain install, made by a role
        -- that owns the database, must not be taken for one by a superuser.
        IF owner OPERATOR(pg_catalog.<>) (SELECT r.oid FROM pg_catalog.pg_roles AS r
                                          WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
            RAISE EXCEPTION USING ERRCODE = '42501',
                MESSAGE = pg_catalog.format('dedup.plain.sql: the schema dedup belongs to %s', owner::pg_catalog.regrole),
                HINT = pg_catalog.format('Run this script as %s, the role that installed dedup.', owner::pg_catalog.regrole);
        END IF;
        IF installed = target THEN
            PERFORM pg_catalog.set_config('search_path', path, true);
            RAISE NOTICE 'dedup % (portable edition, plain install) is installed already; nothing to do', target;
            RETURN;
        END IF;
        IF installed <> target THEN
            RAISE EXCEPTION USING ERRCODE = '55000',
                MESSAGE = pg_catalog.format('dedup.plain.sql: the schema dedup holds version %s of dedup, and this script has no way from it to %s', installed, target),
                HINT = 'Run the plain script of the version installed, or of a version that can update it; '
                       'a newer version is never downgraded.';
        END IF;
        PERFORM pg_catalog.set_config('search_path', path, true);
        EXECUTE pg_catalog.format('COMMENT ON SCHEMA dedup IS %L', pg_catalog.format('dedup %s {PLAIN_MARK}', target));
        RETURN;
    END IF;

    -- A fresh install: what CREATE EXTENSION dedup does, without the extension. The script
    -- names every object with its schema; the search_path is the extension script's anyway.
    CREATE SCHEMA dedup;
    PERFORM pg_catalog.set_config('search_path', 'dedup, pg_temp', true);
    EXECUTE {dollar_quote(install, "_dedup_install_")};
    PERFORM pg_catalog.set_config('search_path', path, true);
    COMMENT ON SCHEMA dedup IS {sql_literal(mark)};
    RAISE NOTICE 'dedup % (portable edition, plain install) installed in the schema dedup', target;
END
"""
    return f"""-- dedup {version}, portable edition: plain install, without an extension (generated by
-- scripts/portable.py). For a server where neither CREATE EXTENSION dedup nor pg_tle is
-- available. One statement: run it with psql -f or any client, as the role that is to own
-- dedup's objects. It creates the schema dedup and everything CREATE EXTENSION dedup would,
-- and records the version in the schema's comment. Running it again is a no-op with a
-- NOTICE; it refuses a database where the extension dedup is installed, and a schema dedup
-- it did not make or of a version it cannot update. See docs/portable.md.
DO {dollar_quote(body, "_dedup_plain_")};
"""


# --- The switch to the native extension ----------------------------------------------


@dataclass
class PortableObjects:
    """What the extension script creates, in the order it last (re)defines each object."""

    tables: list[str]  # in the order of their CREATE TABLE
    drops: list[str]  # DROP statements of every object, last defined first


def _qualified(toks: list[Token], i: int, what: str) -> tuple[str, int]:
    """The name of an object of the schema dedup at toks[i] (dedup.x or x); and the index after it."""
    parts = [toks[i].value]
    i += 1
    while i < len(toks) and toks[i].kind == "op" and toks[i].text == ".":
        parts.append(toks[i + 1].value)
        i += 2
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != SCHEMA):
        raise BuildError(f"{what}: {'.'.join(parts)} is not an object of the schema {SCHEMA}")
    return parts[-1], i


def quote_ident(name: str) -> str:
    if re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return name
    return '"' + name.replace('"', '""') + '"'


# Statements that create nothing that needs a DROP of its own (an index goes with its table).
_NO_OBJECT = {"comment", "grant", "revoke", "select", "alter", "insert", "update", "delete"}


def portable_objects(ext_sql: str, what: str) -> PortableObjects:
    """The tables, views and functions the extension script leaves, read from its statements.
    Any statement this cannot account for (a type, a sequence, a rename) stops the build: the
    switch script's drop list must be exact."""
    statements, _ = split_statements(ext_sql, what)
    last: dict[tuple[str, str, tuple[str, ...]], int] = {}  # (kind, name, argument types) -> position
    tables: list[str] = []
    for pos, st in enumerate(statements):
        toks = st.tokens
        words = [t.value for t in toks if t.kind == "word"][:4]
        fn = parse_function(st)
        if fn is not None:
            last[("FUNCTION", fn.name, fn.input_types)] = pos
            continue
        head = words[0] if words else ""
        if head == "create":
            i = 1
            if _word(toks[i], "or") and _word(toks[i + 1], "replace"):
                i += 2
            if _word(toks[i], "unique"):
                i += 1
            kind = toks[i].value if toks[i].kind == "word" else ""
            if kind == "table":
                name, _ = _qualified(toks, i + 1, what)
                last[("TABLE", name, ())] = pos
                if name not in tables:
                    tables.append(name)
            elif kind == "view":
                name, _ = _qualified(toks, i + 1, what)
                last[("VIEW", name, ())] = pos
            elif kind in ("index", "trigger"):
                pass  # dropped with its table
            else:
                raise BuildError(f"{what}: the switch script does not know how to drop what "
                                 f"'{st.code[:60]}' creates (scripts/portable.py, portable_objects)")
        elif head == "drop":
            if not _word(toks[1], "function"):
                raise BuildError(f"{what}: the switch script does not follow '{st.code[:60]}'")
            i = 2
            if _word(toks[i], "if") and _word(toks[i + 1], "exists"):
                i += 2
            name, i = _qualified(toks, i, what)
            close = _matching_paren(toks, i)
            types = tuple(a.type for a in (_parse_arg(x) for x in _split_top_level(toks[i + 1 : close]))
                          if a.mode in ("in", "inout", "variadic"))
            if last.pop(("FUNCTION", name, types), None) is None:
                raise BuildError(f"{what}: '{st.code[:60]}' drops a function the script did not create")
        elif head == "do":
            # A check (bootstrap.sql's of the schema dedup), never a maker of objects.
            if re.search(r"\bcreate\s+(or\s+replace\s+)?(unique\s+)?(table|view|function|procedure|type|"
                         r"sequence|index|schema|trigger|operator|domain|aggregate|cast|policy|rule)\b",
                         st.code, re.IGNORECASE):
                raise BuildError(f"{what}: the switch script does not know what the DO block "
                                 f"'{st.code[:60]}' creates")
        elif head in _NO_OBJECT:
            if head == "alter" and any(_word(t, "rename") for t in toks) or (
                head == "alter" and any(_word(a, "set") and _word(b, "schema") for a, b in zip(toks, toks[1:]))
            ):
                raise BuildError(f"{what}: the switch script does not follow '{st.code[:60]}'")
        else:
            raise BuildError(f"{what}: the switch script does not know what '{st.code[:60]}' creates")
    drops = []
    for (kind, name, types), _ in sorted(last.items(), key=lambda kv: kv[1], reverse=True):
        target = f"{SCHEMA}.{quote_ident(name)}"
        if kind == "FUNCTION":
            target += "(" + ", ".join(types) + ")"
        drops.append(f"DROP {kind} {target} RESTRICT;")
    if not tables:
        raise BuildError(f"{what}: no CREATE TABLE: is this dedup's script?")
    return PortableObjects(tables, drops)


def build_to_native(ext_sql: str, version: str) -> str:
    """One DO statement that moves a database from the portable edition (pg_tle or the plain
    install) of `version` to the native extension of the same version, keeping every row of
    every table of dedup, in one transaction."""
    objects = portable_objects(plain_install_sql(ext_sql, f"{EXTENSION}--{version}.sql"),
                               f"{EXTENSION}--{version}.sql")
    tables = objects.tables
    table_list = ", ".join(f"{SCHEMA}.{quote_ident(t)}" for t in tables)
    drops = "\n".join(f"            {d}" for d in objects.drops)
    tables_array = "ARRAY[" + ", ".join(sql_literal(t) for t in tables) + "]"
    with open(os.path.join(REPO, "sql", "portable", "to-native.sql.in"), encoding="utf-8") as fh:
        template = fh.read()
    # The template's header comment says what each placeholder is; the body starts after it.
    body = template[template.index("\nDECLARE\n") :]
    for name, value in (("@TARGET@", sql_literal(version)), ("@TABLES@", tables_array),
                        ("@TABLE_LIST@", table_list), ("@DROPS@", drops)):
        if body.count(name) != 1:
            raise BuildError(f"sql/portable/to-native.sql.in: {name} must appear exactly once")
        body = body.replace(name, value)
    return f"""-- dedup {version}: from the portable edition to the native extension, keeping every row
-- (generated by scripts/portable.py; see docs/portable.md, "Moving to the native extension").
--
-- Install the native extension's files on the server first (the package postgresql-N-dedup
-- of dedup {version}), then run this in each database with the portable edition, as a
-- superuser (the native extension needs one):
--     psql "$DATABASE_URL" -f dedup.to-native.sql
-- One statement, so one transaction: it locks dedup's tables (claims wait), copies every
-- row, removes the portable edition (pg_tle: DROP EXTENSION and pgtle.uninstall_extension;
-- plain install: the objects dedup.plain.sql made, RESTRICT), runs CREATE EXTENSION dedup,
-- puts every row back and checks them, and sets again the privileges granted or revoked on
-- dedup's objects. Any failure rolls all of it back; it drops nothing of yours.
DO {dollar_quote(body, "_dedup_to_native_")};
"""


def build(native_path: str, version: str, outdir: str) -> list[str]:
    portable = read_portable(os.path.join(REPO, "sql", "portable"))
    control = read_control(os.path.join(REPO, f"{EXTENSION}.control"))
    if control.get("schema") != SCHEMA:
        raise BuildError(f"{EXTENSION}.control: schema is {control.get('schema')!r}, the portable build expects {SCHEMA!r}")
    with open(native_path, encoding="utf-8") as fh:
        native = fh.read()
    used: set = set()
    problems: list[str] = []
    ext_sql, replaced = replace_c_functions(native, os.path.basename(native_path), portable, used, problems)
    problems += [
        f"{f.statement.source}: {f.signature()} replaces no LANGUAGE c function of {os.path.basename(native_path)}"
        for k, f in portable.replacements.items()
        if k not in used
    ]
    if problems:
        raise BuildError("\n".join(problems))
    if replaced == 0:
        raise BuildError(f"{native_path}: no LANGUAGE c function found: is this the native script?")
    check_no_module_pathname(ext_sql, f"{EXTENSION}--{version}.sql")
    header = (f"-- dedup {version}, portable edition (generated by scripts/portable.py from "
              f"{os.path.basename(native_path)} and sql/portable/*.sql; do not edit).\n"
              f"-- {replaced} LANGUAGE c functions replaced by SQL and PL/pgSQL.\n")
    ext_sql = header + ext_sql
    requires = [r.strip() for r in control.get("requires", "").split(",") if r.strip()]
    os.makedirs(outdir, exist_ok=True)
    written = []
    for name, text in (
        (f"{EXTENSION}--{version}.sql", ext_sql),
        (f"{EXTENSION}.pgtle.sql", build_pgtle(ext_sql, version, control.get("comment", ""), requires)),
        (f"{EXTENSION}.plain.sql", build_plain(ext_sql, version)),
        (f"{EXTENSION}.to-native.sql", build_to_native(ext_sql, version)),
    ):
        path = os.path.join(outdir, name)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("native_script")
    parser.add_argument("version")
    parser.add_argument("outdir")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[0-9][0-9A-Za-z.\-]*", args.version) or "--" in args.version:
        print(f"portable.py: {args.version!r} is not a version", file=sys.stderr)
        return 2
    try:
        written = build(args.native_script, args.version, args.outdir)
    except BuildError as e:
        print(f"portable.py: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"portable.py: {e}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
