#!/usr/bin/env python3
"""docs/reference/errors.md is the catalogue of dedup's errors, checked both ways: every hint
and detail dedup raises is there word for word, and every hint and detail written there is
one dedup raises (a hint removed from the code cannot stay in the docs). This reads both
sides and exits 1, naming each difference.

What dedup raises, each raise with its SQLSTATE and message where they are literal:
  - native: src/**/*.rs: the calls of error.rs's raise(code, message, hint), each
    ErrorReport::new(code, message, ..) with its .set_detail(..) and .set_hint(..), any other
    .set_hint/.set_detail, and a check hook's GUC_check_errhint_string and
    GUC_check_errdetail_string (a hint that is a field, refused.standby_hint, is each string
    written as that field). Every string of 25 characters or more in src/error.rs that is no
    format! template must be one of these, or the reading is broken. And the concern files
    sql/*.sql (not the released sql/dedup--*.sql);
  - portable: sql/portable/*.sql, the switch's template sql/portable/to-native.sql.in (every
    *.sql.in there), and the SQL of the scripts scripts/portable.py writes itself
    (dedup.pgtle.sql, dedup.plain.sql: each string of it that holds a RAISE).
In SQL, the DETAIL and HINT of a RAISE ... USING, the third argument of dedup._raise(code,
message, hint), and `hint :=` / `detail :=` (with the `code :=` and `msg :=` before them).
A text is a literal (adjacent ones are one), each THEN and ELSE of a CASE, a format() whose
%s, %L and %I are gaps, or a || of these whose other parts are gaps; in Rust a literal or a
format! whose {..} are gaps. A gap matches any text of the catalogue: errors.md writes
*owner* for one, or the value of its example.

What errors.md writes as a hint or detail: each cell of a table column "Hint", read as a
sequence of hints, each after an optional label that ends with a colon ("`scope`:",
"Read-only:"); after a label that starts with "Detail" or ends with "detail:", a detail; an
aside wholly in parentheses is neither. A cell of a column "Message, detail and hint" is read
the same way from its first "Detail:", "Detail," or "Hint:" on (the message before is not
checked). And each HINT: and DETAIL: line of the examples' output (```text).

It fails on a text raised that errors.md lacks; on text errors.md writes as a hint or detail
(or the rest of one) that nothing raises; on a hint written as a detail or the reverse; and,
for the two editions:
  - a text only the portable edition raises must be under errors.md's heading "The portable
    edition's own errors", and nothing there may be a text the native edition raises;
  - a raise of the portable edition is paired with the native raises whose message its
    message is an instance of ('%s: %s must not be NULL' of "{func}: {arg} must not be
    NULL"; failing that, those whose message is an instance of its own): it must have one of
    their SQLSTATEs, and each of its hints and details must be one of theirs.
`--pairs` lists each raise of the portable edition with what it was paired with, or none.

Whitespace and backquotes do not count. docs::every_hint_is_in_the_errors_reference runs it.

    python3 scripts/check-errors.py [--pairs]
"""
from __future__ import annotations

import ast
import bisect
import glob
import os
import re
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import portable  # noqa: E402  (its SQL lexer: a hint is a string token, wherever its quotes are)

CATALOGUE = "docs/reference/errors.md"
# The heading of errors.md under which the texts only the portable edition raises are.
PORTABLE_SECTION = "The portable edition's own errors"
GAP = "\x00"  # a part of a text that is not written in the source (a format argument)
MIN_TEXTS = 50  # fewer hints and details than this: the reading is broken

# The SQLSTATE of each PgSqlErrorCode src/ uses (an unknown one is a failure: add it).
ERRCODES = {
    "ERRCODE_WARNING": "01000",
    "ERRCODE_FEATURE_NOT_SUPPORTED": "0A000",
    "ERRCODE_STRING_DATA_RIGHT_TRUNCATION": "22001",
    "ERRCODE_NULL_VALUE_NOT_ALLOWED": "22004",
    "ERRCODE_INVALID_PARAMETER_VALUE": "22023",
    "ERRCODE_INVALID_TRANSACTION_STATE": "25000",
    "ERRCODE_READ_ONLY_SQL_TRANSACTION": "25006",
    "ERRCODE_T_R_SERIALIZATION_FAILURE": "40001",
    "ERRCODE_UNDEFINED_TABLE": "42P01",
    "ERRCODE_INSUFFICIENT_PRIVILEGE": "42501",
    "ERRCODE_CONFIGURATION_LIMIT_EXCEEDED": "53400",
    "ERRCODE_PROGRAM_LIMIT_EXCEEDED": "54000",
    "ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE": "55000",
    "ERRCODE_OBJECT_IN_USE": "55006",
}
# RAISE without ERRCODE: PL/pgSQL's default for the level.
RAISE_DEFAULT = {"exception": "P0001", "warning": "01000", "notice": "00000", "info": "00000",
                 "log": "00000", "debug": "00000"}


def norm(text: str) -> str:
    """Whitespace and backquotes do not count; adjacent gaps are one."""
    text = re.sub(r"\s+", " ", text.replace("`", "")).strip()
    return re.sub(GAP + "+", GAP, text)


def read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def _line_of(text: str):
    starts = [0] + [m.end() for m in re.finditer("\n", text)]
    return lambda pos: bisect.bisect_right(starts, pos)


@dataclass
class Site:
    """One raise: where, which edition, its SQLSTATE (None: not literal) and the
    alternatives of its message, hint and detail (texts, GAP where a value goes)."""
    where: str
    edition: str  # native or portable
    sqlstate: str | None
    messages: list = field(default_factory=list)
    hints: list = field(default_factory=list)
    details: list = field(default_factory=list)


def _add(sites: list, site: Site) -> None:
    site.messages = [norm(m) for m in site.messages if norm(m).strip(GAP + " ")]
    site.hints = [norm(h) for h in site.hints if norm(h).strip(GAP + " ")]
    site.details = [norm(d) for d in site.details if norm(d).strip(GAP + " ")]
    if site.messages or site.hints or site.details:
        sites.append(site)


# --- Rust ------------------------------------------------------------------------------

@dataclass
class RTok:
    kind: str  # ident, str, num, punct, char, lifetime
    value: str  # a string unescaped
    pos: int


_RUST_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def _rust_unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt == "\n":  # a continued line: the newline and the next line's indent go
            i += 2
            while i < len(body) and body[i] in " \t\r\n":
                i += 1
        elif nxt == "u":
            close = body.index("}", i)
            out.append(chr(int(body[i + 3 : close], 16)))
            i = close + 1
        elif nxt == "x":
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        else:
            out.append(_RUST_ESCAPES.get(nxt, nxt))
            i += 2
    return "".join(out)


_TWO_CHAR = {"=>", "==", "!=", "::", "->", "&&", "||", "<=", ">=", ".."}


def rust_tokens(src: str) -> list:
    """The tokens of Rust source, comments left out; strings (b"", c"", r#""#) unescaped."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth = 0
            while i < n:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                    if depth == 0:
                        break
                else:
                    i += 1
        elif m := re.compile(r'(?:b|c)?r(#*)"').match(src, i):
            end = src.index('"' + m.group(1), m.end())
            out.append(RTok("str", src[m.end() : end], i))
            i = end + 1 + len(m.group(1))
        elif m := re.compile(r'(?:b|c)?"').match(src, i):
            j = m.end()
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(RTok("str", _rust_unescape(src[m.end() : j]), i))
            i = j + 1
        elif c == "'":
            m = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'])'").match(src, i)
            if m:
                out.append(RTok("char", m.group(0), i))
            else:
                m = re.compile(r"'[A-Za-z_]\w*").match(src, i)
                out.append(RTok("lifetime", m.group(0), i))
            i = m.end()
        elif m := re.compile(r"[A-Za-z_]\w*").match(src, i):
            out.append(RTok("ident", m.group(0), i))
            i = m.end()
        elif m := re.compile(r"\d[\w]*").match(src, i):
            out.append(RTok("num", m.group(0), i))
            i = m.end()
        else:
            two = src[i : i + 2]
            out.append(RTok("punct", two if two in _TWO_CHAR else c, i))
            i += len(two) if two in _TWO_CHAR else 1
    return out


def _rust_close(toks: list, i: int) -> int:
    """i is at an opening (, [ or {: the index of its closing one."""
    depth = 0
    for j in range(i, len(toks)):
        if toks[j].kind == "punct" and toks[j].value in "([{":
            depth += 1
        elif toks[j].kind == "punct" and toks[j].value in ")]}":
            depth -= 1
            if depth == 0:
                return j
    raise ValueError("unbalanced brackets")


def _rust_args(toks: list, open_: int) -> list:
    """The top-level comma-separated arguments of the call whose ( is at open_."""
    close = _rust_close(toks, open_)
    args, cur, depth = [], [], 0
    for t in toks[open_ + 1 : close]:
        if t.kind == "punct" and t.value in "([{":
            depth += 1
        elif t.kind == "punct" and t.value in ")]}":
            depth -= 1
        if depth == 0 and t.kind == "punct" and t.value == ",":
            args.append(cur)
            cur = []
        else:
            cur.append(t)
    if cur:
        args.append(cur)
    return args


def _rust_format(template: str) -> str:
    return re.sub(r"\{\{|\}\}|\{[^{}]*\}",
                  lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), GAP), template)


def rust_texts(expr: list, all_toks: list) -> tuple:
    """The texts an expression can be (each literal or format! in a value position: not a
    compared or matched one), and the strings they came from."""
    texts, used, k = [], [], 0
    while k < len(expr):
        t = expr[k]
        if (t.kind == "ident" and k + 2 < len(expr) and expr[k + 1].value == "!"
                and expr[k + 2].value == "("):
            inner = expr[k + 2 :]
            close = k + 2 + _rust_close(inner, 0)
            if t.value == "format":
                first = next((x for x in expr[k + 3 : close] if x.kind == "str"), None)
                if first:
                    texts.append(_rust_format(first.value))
                    used.append(first.value)
            k = close + 1  # matches!(...) and the rest: compared, not raised
            continue
        if t.kind == "str":
            prev = expr[k - 1].value if k > 0 else None
            nxt = expr[k + 1].value if k + 1 < len(expr) else None
            if prev not in ("==", "!=", "|") and nxt not in ("=>", "|", "==", "!="):
                texts.append(t.value)
                used.append(t.value)
        k += 1
    # A field (refused.standby_hint): every string written as that field in the file.
    if not texts and len(expr) == 3 and expr[1].value == "." and expr[2].kind == "ident":
        name = expr[2].value
        for j in range(len(all_toks) - 2):
            if (all_toks[j].kind == "ident" and all_toks[j].value == name
                    and all_toks[j + 1].value == ":" and all_toks[j + 2].kind == "str"):
                texts.append(all_toks[j + 2].value)
                used.append(all_toks[j + 2].value)
    return texts, used


def _errcode(expr: list) -> str | None:
    for t in expr:
        if t.kind == "ident" and t.value.startswith("ERRCODE_"):
            if t.value not in ERRCODES:
                raise ValueError(f"check-errors.py: add {t.value} to ERRCODES")
            return ERRCODES[t.value]
    return None


def rust_sites(src: str, rel: str, problems: list | None = None) -> list:
    """The raises of one Rust file. With problems, a file named error.rs is also checked:
    every string of 25 characters or more in it must be a message, hint or detail read."""
    toks = rust_tokens(src)
    line = _line_of(src)
    sites, used, chained = [], set(), set()
    guc = None
    for k, t in enumerate(toks):
        if t.kind != "ident":
            continue
        nxt = toks[k + 1].value if k + 1 < len(toks) else None
        where = f"{rel}:{line(t.pos)}"
        if t.value == "raise" and nxt == "(" and (k == 0 or toks[k - 1].value != "fn"):
            args = _rust_args(toks, k + 1)
            if len(args) == 3:
                msgs, u1 = rust_texts(args[1], toks)
                hints, u2 = rust_texts(args[2], toks)
                used.update(u1 + u2)
                _add(sites, Site(where, "native", _errcode(args[0]), msgs, hints))
        elif (t.value == "ErrorReport" and nxt == "::" and k + 3 < len(toks)
              and toks[k + 2].value == "new" and toks[k + 3].value == "("):
            args = _rust_args(toks, k + 3)
            msgs, u = rust_texts(args[1], toks) if len(args) > 1 else ([], [])
            used.update(u)
            site = Site(where, "native", _errcode(args[0]) if args else None, msgs)
            m = _rust_close(toks, k + 3) + 1
            while (m + 2 < len(toks) and toks[m].value == "." and toks[m + 1].kind == "ident"
                   and toks[m + 2].value == "("):
                call = toks[m + 1].value
                if call in ("set_hint", "set_detail"):
                    chained.add(m + 1)
                    texts, u = rust_texts(_rust_args(toks, m + 2)[0], toks)
                    used.update(u)
                    (site.hints if call == "set_hint" else site.details).extend(texts)
                m = _rust_close(toks, m + 2) + 1
            _add(sites, site)
        elif t.value in ("set_hint", "set_detail") and k not in chained and nxt == "(" \
                and k > 0 and toks[k - 1].value == ".":
            texts, u = rust_texts(_rust_args(toks, k + 1)[0], toks)
            used.update(u)
            _add(sites, Site(where, "native", None, [], texts if t.value == "set_hint" else [],
                             texts if t.value == "set_detail" else []))
        elif t.value == "GUC_check_errcode" and nxt == "(":
            guc = Site(where, "native", _errcode(_rust_args(toks, k + 1)[0]))
            sites.append(guc)
        elif t.value in ("GUC_check_errhint_string", "GUC_check_errdetail_string") and nxt == "=":
            end = next(j for j in range(k, len(toks)) if toks[j].value == ";")
            texts, u = rust_texts(toks[k + 2 : end], toks)
            used.update(u)
            if guc is None:
                guc = Site(where, "native", None)
                sites.append(guc)
            (guc.hints if "hint" in t.value else guc.details).extend(norm(x) for x in texts)
    if problems is not None and os.path.basename(rel) == "error.rs":
        for k, t in enumerate(toks):
            in_format = k >= 3 and [x.value for x in toks[k - 3 : k]] == ["format", "!", "("]
            if t.kind == "str" and len(t.value) >= 25 and t.value not in used and not in_format:
                problems.append(f"{rel}:{line(t.pos)}: a string that is no message, hint or detail "
                                f"check-errors.py reads (is the reading broken?): {t.value[:80]}")
    return [s for s in sites if s.messages or s.hints or s.details]


# --- SQL -------------------------------------------------------------------------------

@dataclass
class STok:
    kind: str
    text: str
    value: str
    pos: int


def sql_tokens(sql: str, base: int = 0) -> list:
    """sql's tokens, each dollar-quoted body (a function's, a DO block's) read as tokens too,
    with their offsets in sql."""
    out = []
    for s, e, kind in portable.lex(sql):
        if kind in ("ws", "comment"):
            continue
        t = portable._token(sql, s, e, kind)
        if kind == "dollar":
            tag = portable._DOLLAR_TAG.match(t.text).group(0)
            out += sql_tokens(t.value, base + s + len(tag))
        else:
            out.append(STok(t.kind, t.text, t.value, base + s))
    return out


def _sql_split(toks: list, sep: str = ",") -> list:
    """toks split at each top-level sep, "," or "||" (outside parentheses and CASE ... END)."""
    parts, cur, depth, k = [], [], 0, 0
    while k < len(toks):
        t = toks[k]
        if (t.kind == "op" and t.text in "([") or (t.kind == "word" and t.value == "case"):
            depth += 1
        elif (t.kind == "op" and t.text in ")]") or (t.kind == "word" and t.value == "end"):
            depth -= 1
        if depth == 0 and sep == "||" and t.text == "|" and k + 1 < len(toks) \
                and toks[k + 1].text == "|" and toks[k + 1].pos == t.pos + 1:
            parts.append(cur)
            cur, k = [], k + 2
            continue
        if depth == 0 and sep == "," and t.kind == "op" and t.text == ",":
            parts.append(cur)
            cur = []
        else:
            cur.append(t)
        k += 1
    parts.append(cur)
    return parts


def _sql_format(template: str) -> str:
    return re.sub(r"%%|%(?:\d+\$)?-?\d*[sIL]", lambda m: "%" if m.group(0) == "%%" else GAP, template)


def sql_texts(toks: list) -> list:
    """The texts an SQL expression can be: a literal (adjacent ones are one), each branch of
    a CASE, a format() with a gap for each placeholder, a || of these; [] for anything else
    (a variable, a call)."""
    while len(toks) >= 2 and toks[0].text == "(" and portable._matching_paren(toks, 0) == len(toks) - 1:
        toks = toks[1:-1]
    if not toks:
        return []
    parts = _sql_split(toks, "||")
    if len(parts) > 1:
        alts, any_text = [""], False
        for part in parts:
            texts = sql_texts(part)
            any_text = any_text or bool(texts)
            alts = [a + b for a in alts for b in (texts or [GAP])]
        return alts if any_text else []
    first = toks[0]
    if first.kind == "word" and first.value == "case":
        return _case_texts(toks)
    if first.kind == "string":
        k, s = 0, ""
        while k < len(toks) and toks[k].kind == "string":
            s += toks[k].value
            k += 1
        return [s]
    k = 2 if len(toks) > 2 and toks[1].text == "." else 0
    if toks[k].kind == "word" and toks[k].value == "format" and k + 1 < len(toks) and toks[k + 1].text == "(":
        close = portable._matching_paren(toks, k + 1)
        args = _sql_split(toks[k + 2 : close])
        return [_sql_format(x) for x in sql_texts(args[0])] if args and args[0] else []
    return []


def _case_texts(toks: list) -> list:
    out, depth, cur, taking = [], 0, [], False
    for t in toks[1:]:
        word = t.value if t.kind == "word" else None
        if depth == 0 and word in ("when", "else", "end"):
            if taking:
                out += sql_texts(cur)
            cur, taking = [], word == "else"
            if word == "end":
                break
            continue
        if depth == 0 and word == "then":
            cur, taking = [], True
            continue
        if t.text == "(" or word == "case":
            depth += 1
        elif t.text == ")" or word == "end":
            depth -= 1
        cur.append(t)
    return out


def _literal(expr: list) -> str | None:
    return expr[0].value if len(expr) == 1 and expr[0].kind == "string" else None


def sql_sites(sql: str, rel: str, edition: str, line_base: int = 0) -> list:
    """The raises of SQL text: RAISE ... USING, dedup._raise(code, message, hint), and
    hint := (detail :=) after code := and msg :=."""
    toks = sql_tokens(sql)
    line = _line_of(sql)
    sites = []
    statements, cur = [], []
    for t in toks:
        if t.kind == "semicolon":
            statements.append(cur)
            cur = []
        else:
            cur.append(t)
    statements.append(cur)
    code, msgs = None, []
    for st in statements:
        if any(t.kind == "word" and t.value == "function" for t in st[:4]):
            code, msgs = None, []  # CREATE [OR REPLACE] FUNCTION: a new body
        for k, t in enumerate(st):
            if t.kind != "word":
                continue
            where = f"{rel}:{line_base + line(t.pos)}"
            if t.value == "raise":
                using = next((j for j in range(k + 1, len(st)) if st[j].kind == "word"
                              and st[j].value in ("using", "raise")), None)
                if using is None or st[using].value != "using":
                    continue
                level = st[k + 1].value if k + 1 < len(st) else "exception"
                site = Site(where, edition, RAISE_DEFAULT.get(level, "P0001"))
                for opt in _sql_split(st[using + 1 :]):
                    if len(opt) < 3 or opt[0].kind != "word" or opt[1].text != "=":
                        continue
                    name, expr = opt[0].value, opt[2:]
                    if name == "errcode":
                        site.sqlstate = _literal(expr)
                    elif name == "message":
                        site.messages = sql_texts(expr)
                    elif name == "hint":
                        site.hints = sql_texts(expr)
                    elif name == "detail":
                        site.details = sql_texts(expr)
                _add(sites, site)
            elif t.value == "_raise" and k + 1 < len(st) and st[k + 1].text == "(":
                close = portable._matching_paren(st, k + 1)
                args = _sql_split(st[k + 2 : close])
                if len(args) == 3:
                    _add(sites, Site(where, edition, _literal(args[0]), sql_texts(args[1]),
                                     sql_texts(args[2])))
            elif k + 2 < len(st) and st[k + 1].text == ":" and st[k + 2].text == "=" \
                    and st[k + 2].pos == st[k + 1].pos + 1:
                expr = st[k + 3 :]
                if t.value in ("code", "sqlstate"):
                    code = _literal(expr)
                elif t.value in ("msg", "message"):
                    msgs = sql_texts(expr)
                elif t.value in ("hint", "detail"):
                    texts = sql_texts(expr)
                    _add(sites, Site(where, edition, code, list(msgs), texts if t.value == "hint" else [],
                                     texts if t.value == "detail" else []))
    return sites


def python_sql(src: str):
    """(line, text) of each string of Python source that holds a RAISE, an f-string's
    replacement fields read as gaps."""
    tree = ast.parse(src)
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else GAP for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            text = node.value
        else:
            continue
        if re.search(r"\bRAISE\b", text):
            yield node.lineno, text


# --- The sources -----------------------------------------------------------------------

def source_sites(problems: list) -> list:
    sites = []
    for path in sorted(glob.glob(os.path.join(REPO, "src", "**", "*.rs"), recursive=True)):
        rel = os.path.relpath(path, REPO)
        sites += rust_sites(read(rel), rel, problems)
    for path in sorted(glob.glob(os.path.join(REPO, "sql", "*.sql"))):
        rel = os.path.relpath(path, REPO)
        if not os.path.basename(rel).startswith("dedup--"):  # released: never changes
            sites += sql_sites(read(rel), rel, "native")
    for path in sorted(glob.glob(os.path.join(REPO, "sql", "portable", "*.sql"))) + sorted(
            glob.glob(os.path.join(REPO, "sql", "portable", "*.sql.in"))):
        rel = os.path.relpath(path, REPO)
        sites += sql_sites(read(rel), rel, "portable")
    rel = "scripts/portable.py"
    for lineno, text in python_sql(read(rel)):
        sites += sql_sites(text, rel, "portable", lineno - 1)
    return sites


# --- The catalogue ---------------------------------------------------------------------

def _regex(pattern: str) -> str:
    return ".{1,200}?".join(re.escape(p) for p in pattern.split(GAP))


@dataclass
class Text:
    """One hint or detail text raised: its pattern, kind, and where each raise is."""
    kind: str
    pattern: str
    sites: list
    regex: re.Pattern = None
    at: re.Pattern = None  # matches at a position of a cell, up to a boundary

    def __post_init__(self):
        self.regex = re.compile(_regex(self.pattern))
        self.at = re.compile(_regex(self.pattern) + r"(?=\s|$)")

    @property
    def editions(self) -> set:
        return {s.edition for s in self.sites}


def raised_texts(sites: list) -> list:
    by_key = {}
    for s in sites:
        for kind, texts in (("hint", s.hints), ("detail", s.details)):
            for p in texts:
                by_key.setdefault((kind, p), []).append(s)
    return [Text(kind, p, ss) for (kind, p), ss in by_key.items()]


@dataclass
class Unit:
    """A hint or detail written in the catalogue."""
    where: str
    kind: str
    text: str
    portable_only: bool
    matches: list = field(default_factory=list)  # the Texts it is


_LABEL = re.compile(r"[^:]{1,120}?:(?=\s)")


def _segment(cell: str, texts: list, where: str, portable_only: bool, units: list):
    """Read a cell: hints (details after a label that starts with "Detail" or ends with
    "detail:"), each after an optional label; asides in parentheses. Text that is none of
    these is reported as a unit that matches nothing."""
    pos, kind, label_at = 0, "hint", None
    n = len(cell)
    while True:
        while pos < n and cell[pos] == " ":
            pos += 1
        if pos >= n:
            break
        best = None
        for t in texts:
            m = t.at.match(cell, pos)
            if m and (best is None or m.end() > best[1].end() or
                      (m.end() == best[1].end() and t.kind == kind and best[0].kind != kind)):
                best = (t, m)
        if best:
            text = cell[pos : best[1].end()]
            units.append(Unit(where, kind, text, portable_only))
            pos, kind, label_at = best[1].end(), "hint", None
            continue
        if cell[pos] == "(":
            depth, j = 0, pos
            while j < n:
                depth += {"(": 1, ")": -1}.get(cell[j], 0)
                if depth == 0:
                    break
                j += 1
            if j < n and (j + 1 == n or cell[j + 1] == " "):
                pos = j + 1
                continue
        m = _LABEL.match(cell, pos)
        if m and ". " not in m.group(0) and label_at is None:
            label = m.group(0).lower()
            kind = "detail" if label.startswith("detail") or label.endswith("detail:") else "hint"
            label_at, pos = pos, m.end()
            continue
        # No text raised starts here: what is written, up to the next text raised.
        start = label_at if label_at is not None else pos
        ends = [m.start() for t in texts for m in [t.at.search(cell, pos + 1)]
                if m and cell[m.start() - 1] == " "]
        end = min(ends) if ends else n
        units.append(Unit(where, kind, cell[start:end].strip(), portable_only))
        pos, kind, label_at = end, "hint", None


def _cells(row: str) -> list:
    """A table row's cells (a | inside a code span or escaped does not split)."""
    cells, cur, code, i = [], "", False, 0
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    while i < len(row):
        c = row[i]
        if c == "\\" and i + 1 < len(row) and row[i + 1] == "|":
            cur += "|"
            i += 2
            continue
        if c == "`":
            code = not code
        if c == "|" and not code:
            cells.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    cells.append(cur)
    return [c.strip() for c in cells]


def catalogue_units(md: str, texts: list, rel: str = CATALOGUE) -> list:
    """The hints and details written in the catalogue, each with the Texts it is."""
    units = []
    section, fence, header = "", None, None
    lines = md.split("\n")
    for no, raw in enumerate(lines, 1):
        line = raw.rstrip()
        where = f"{rel}:{no}"
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
            continue
        if fence is not None:
            m = re.match(r"(HINT|DETAIL):\s+(.*)$", line)
            if fence == "text" and m:
                units.append(Unit(where, m.group(1).lower(), norm(m.group(2)),
                                  section == PORTABLE_SECTION))
            continue
        if line.startswith("## "):
            section = line[3:].strip()
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if all(re.fullmatch(r":?-+:?", c) for c in cells if c):
            continue
        for name, cell in zip(header, cells):
            cell = norm(cell)
            if name == "hint":
                start = 0
            elif name == "message, detail and hint":
                m = re.search(r"(?:^|\s)(?:Detail|Hint)[:,]\s", cell)
                if not m:
                    continue
                start = m.start()
            else:
                continue
            _segment(cell[start:], texts, where, section == PORTABLE_SECTION, units)
    for u in units:
        u.matches = [t for t in texts if t.regex.fullmatch(u.text)]
    return units


# --- The checks ------------------------------------------------------------------------

def _where(text: "Text") -> str:
    return ", ".join(sorted({s.where for s in text.sites}))


def pairs(sites: list) -> list:
    """Each portable raise with a literal message, and the native raises it is paired with:
    those whose message its message is an instance of (its gaps filled in), or when there is
    none, those whose message is an instance of its message (the portable one takes as an
    argument what the native one writes, as '%s: retention must be positive whatever a
    month''s length, not %s' with the shortest month's seconds in its last %s); [] when none."""
    natives = [(m, re.compile(_regex(m), re.S), s) for s in sites if s.edition == "native"
               for m in s.messages]
    out = []
    for p in sites:
        if p.edition != "portable" or not p.messages:
            continue
        mine = [re.compile(_regex(m), re.S) for m in p.messages]
        cands = [n for _, rx, n in natives if any(rx.fullmatch(m) for m in p.messages)]
        if not cands:
            cands = [n for m, _, n in natives if any(rx.fullmatch(m) for rx in mine)]
        out.append((p, list({id(n): n for n in cands}.values())))
    return out


def check(sites: list, md: str) -> tuple:
    """(problems, summary) of the sources' raises against the catalogue md."""
    problems = []
    texts = raised_texts(sites)
    units = catalogue_units(md, texts)
    native = {t.pattern for t in texts if "native" in t.editions}

    # Written in the catalogue, raised by nothing (or raised as the other kind).
    for u in units:
        same = [t for t in u.matches if t.kind == u.kind]
        if same:
            continue
        if u.matches:
            other = u.matches[0]
            problems.append(f"{u.where}: written as a {u.kind}, raised as a {other.kind} "
                            f"({_where(other)}): {u.text}")
        else:
            problems.append(f"{u.where}: a {u.kind} in the catalogue that no source raises: {u.text}")

    # Raised, not in the catalogue.
    for t in texts:
        found = [u for u in units if t in u.matches and u.kind == t.kind]
        if not found:
            problems.append(f"{_where(t)}: not in {CATALOGUE}: {t.pattern.replace(GAP, '…')}")
            continue
        if "native" not in t.editions and not any(u.portable_only for u in found):
            problems.append(f"{_where(t)}: raised by the portable edition only, but not under "
                            f"\"{PORTABLE_SECTION}\" in {CATALOGUE}: {t.pattern.replace(GAP, '…')}")
    for u in units:
        if u.portable_only:
            theirs = [t for t in u.matches if t.pattern in native]
            if theirs:
                problems.append(f"{u.where}: under \"{PORTABLE_SECTION}\", but the native edition "
                                f"raises it too ({_where(theirs[0])}): {u.text}")

    # The portable edition's raise of a native message: the same SQLSTATE, hints and details.
    paired = pairs(sites)
    for p, cands in paired:
        if not cands:
            continue
        same = [n for n in cands if n.sqlstate == p.sqlstate]
        if not same:
            problems.append(f"{p.where}: SQLSTATE {p.sqlstate}, but the native raise of this message "
                            f"has {', '.join(sorted({str(n.sqlstate) for n in cands}))} "
                            f"({', '.join(n.where for n in cands)}): {p.messages[0].replace(GAP, '…')}")
            continue
        for what, mine, theirs in (("hint", p.hints, {h for n in same for h in n.hints}),
                                   ("detail", p.details, {d for n in same for d in n.details})):
            for x in mine:
                if x not in theirs:
                    problems.append(f"{p.where}: a {what} the native raise of this message "
                                    f"({', '.join(n.where for n in same)}) does not give: "
                                    f"{x.replace(GAP, '…')}")
            if theirs and not mine:
                problems.append(f"{p.where}: no {what}, but the native raise of this message "
                                f"({', '.join(n.where for n in same)}) gives one: "
                                f"{p.messages[0].replace(GAP, '…')}")
    n_paired = sum(1 for _, c in paired if c)
    summary = (f"{len(texts)} hints and details raised ({len(units)} in the catalogue), "
               f"{n_paired} of {len(paired)} portable raises paired with native ones, "
               f"{len(problems)} problems")
    return problems, summary


def main(argv: list) -> int:
    problems = []
    sites = source_sites(problems)
    found, summary = check(sites, read(CATALOGUE))
    problems += found
    if "--pairs" in argv:
        for p, cands in pairs(sites):
            msg = p.messages[0].replace(GAP, "…")
            if cands:
                print(f"paired   {p.where} {p.sqlstate} {msg}\n         with {', '.join(n.where for n in cands)}")
            else:
                shared = [h for h in p.hints + p.details if any(
                    h in (n.hints + n.details) for n in sites if n.edition == "native")]
                note = " (its hint or detail is native's: the messages differ?)" if shared else ""
                print(f"unpaired {p.where} {p.sqlstate} {msg}{note}")
    for p in problems:
        print(p)
    n = len(raised_texts(sites))
    if n < MIN_TEXTS:
        print(f"check-errors.py: only {n} hints and details found: is the reading broken?")
        return 1
    print(f"check-errors.py: {summary}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
