#!/usr/bin/env python3
"""docs/reference/errors.md is the catalogue of dedup's errors: every hint and detail dedup
raises is there word for word. This reads them where they are written and exits 1, naming
each one the catalogue lacks:

  - src/error.rs: every string literal that is a sentence (it starts with a capital letter
    and is not a format! message), which is where the native library's hints and details
    are written (its messages are format!s naming the function);
  - sql/*.sql (the concern files) and sql/portable/*.sql: HINT = '...' and DETAIL = '...' of
    a RAISE, and the third argument of dedup._raise(sqlstate, message, hint).

Whitespace and backquotes do not count. docs::every_hint_is_in_the_errors_reference runs it.

    python3 scripts/check-errors.py
"""
import glob
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import portable  # noqa: E402  (its SQL lexer: a hint is a string token, wherever its quotes are)


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("`", "")).strip()


def read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def rust_sentences(rel: str):
    src = read(rel)
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', src, re.S):
        line = src[src.rfind("\n", 0, m.start()) + 1 : m.start()]
        text = re.sub(r"\\\n\s*", "", m.group(1))
        text = text.replace('\\"', '"').replace("\\\\", "\\")
        if "format!" in line or line.strip().startswith("//") or len(text) < 25 or not text[:1].isupper():
            continue
        yield rel, text


def _tokens(sql: str) -> list:
    """sql's tokens, each dollar-quoted body (a function's, a DO block's) read as tokens too."""
    out = []
    for s, e, kind in portable.lex(sql):
        if kind in ("ws", "comment"):
            continue
        t = portable._token(sql, s, e, kind)
        if kind == "dollar":
            out += _tokens(t.value)
        else:
            out.append(t)
    return out


def sql_hints(rel: str):
    for toks in _statements(read(rel)):
        for k, t in enumerate(toks):
            # HINT = 'a' 'b' ... / DETAIL = ...: adjacent literals are one string.
            if t.kind == "word" and t.value in ("hint", "detail") and k + 2 < len(toks) \
                    and toks[k + 1].text == "=" and toks[k + 2].kind == "string":
                yield rel, _literal(toks, k + 2)
            # dedup._raise(sqlstate, message, hint): the third argument, when a literal.
            if t.kind == "word" and t.value == "_raise" and k + 1 < len(toks) and toks[k + 1].text == "(":
                close = portable._matching_paren(toks, k + 1)
                args = portable._split_top_level(toks[k + 2 : close])
                if len(args) == 3 and args[2] and all(x.kind == "string" for x in args[2]):
                    yield rel, "".join(x.value for x in args[2])


def _statements(sql: str):
    """The token lists of sql's statements, those inside function bodies included (split at
    every semicolon: a hint never spans one)."""
    current = []
    for t in _tokens(sql):
        if t.kind == "semicolon":
            yield current
            current = []
        else:
            current.append(t)
    yield current


def _literal(toks, k: int) -> str:
    parts = []
    while k < len(toks) and toks[k].kind == "string":
        parts.append(toks[k].value)
        k += 1
    return "".join(parts)


def main() -> int:
    catalogue = norm(read("docs/reference/errors.md"))
    found = list(rust_sentences("src/error.rs"))
    for path in sorted(glob.glob(os.path.join(REPO, "sql", "*.sql"))) + sorted(
            glob.glob(os.path.join(REPO, "sql", "portable", "*.sql"))):
        rel = os.path.relpath(path, REPO)
        if not os.path.basename(rel).startswith("dedup--"):
            found += list(sql_hints(rel))
    missing = [(rel, text) for rel, text in found if norm(text) not in catalogue]
    for rel, text in missing:
        print(f"{rel}: not in docs/reference/errors.md: {text}")
    if len(found) < 50:
        print(f"check-errors.py: only {len(found)} hints and details found: is the reading broken?")
        return 1
    print(f"check-errors.py: {len(found)} hints and details, {len(missing)} not in the catalogue")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
