#!/usr/bin/env python3
"""Assemble an upgrade script from its recipe: sql/upgrade/NEW.sql makes sql/dedup--OLD--NEW.sql.

Nothing of an upgrade script is pasted: each object's definition is written once, in the
concern file of sql/ that a new install runs (or in src/, for a LANGUAGE c function), and the
recipe names what the upgrade takes from there. A recipe is SQL with directives:

  --@ upgrade OLD NEW                   the versions (first; the recipe is sql/upgrade/NEW.sql)
  --@ create SOURCE OBJECT              every statement of SOURCE that makes or names OBJECT,
                                        as written, with the comment paragraph right above it
  --@ replace SOURCE OBJECT             the same, CREATE FUNCTION and CREATE VIEW made
                                        CREATE OR REPLACE (for an object OLD has)

SOURCE is a concern file of sql/ (leases.sql), or `library`: the install script pgrx
generates from src/ (the LANGUAGE c functions and the comments src/ declares on them).
OBJECT is dedup.NAME (every overload of a function), dedup.NAME(TYPE, ...) (one overload), or
`*` (every statement of SOURCE). A statement names an object when it creates, alters,
comments on, grants or revokes on it, dumps it (pg_extension_config_dump) or inserts into it.
Every other line of the recipe is copied as written: what only an upgrade does (DROP,
ALTER TABLE ... ADD COLUMN, a migration of rows).

  python3 scripts/upgrade-script.py sql/upgrade/0.6.0.sql [--library PATH] [--check]
  python3 scripts/upgrade-script.py --propose REV


--library is the generated install script (default: dedup--NEW.sql in the share directory
of DEDUP_PG_CONFIG, or of the pg_config on PATH, after `cargo pgrx install`). --check
writes nothing and exits 1 when the committed script differs from what the recipe makes;
upgrade::the_newest_upgrade_script_is_what_its_recipe_makes runs it. Only the recipe of an
unreleased version is ever run again: a released script never changes.

--propose REV starts the next recipe: it compares the concern files as they were at the git
revision REV (the commit of the last release) with the work tree, object by object, and
prints a directive for each object made or changed since (`--@ create`, `--@ replace` for a
function or view), a DROP for each one gone, and a note for each table changed (its
ALTER TABLE is written by hand: only the recipe knows how the rows move). LANGUAGE c
functions are declared in src/, not in the concern files: their lines are written by hand
(`--@ create library dedup.NAME`).
"""
import argparse
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import portable  # noqa: E402  (the SQL lexer and function headers the portable build uses)
from portable import BuildError, Statement, lex, parse_function, split_statements  # noqa: E402

REPO = portable.REPO
SQL = os.path.join(REPO, "sql")
GENERATED = "-- Made by scripts/upgrade-script.py from {recipe}: edit the recipe, not this file.\n"


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _types(tokens) -> tuple[str, ...]:
    """The input types of an argument list's tokens (between its parentheses)."""
    args = [portable._parse_arg(x) for x in portable._split_top_level(tokens)] if tokens else []
    return tuple(a.type for a in args if a.mode in ("in", "inout", "variadic"))


def _name_and_types(toks, i: int, what: str):
    """The object at toks[i]: (name, input types or None for a relation), and for a column
    dedup.table.column its table."""
    parts = [toks[i].value]
    j = i + 1
    while j < len(toks) and toks[j].kind == "op" and toks[j].text == ".":
        parts.append(toks[j + 1].value)
        j += 2
    if parts[0] == portable.SCHEMA and len(parts) > 1:
        parts = parts[1:]
    if j < len(toks) and toks[j].kind == "op" and toks[j].text == "(":
        close = portable._matching_paren(toks, j)
        return parts[0], _types(toks[j + 1 : close])
    return parts[0], None


def targets(st: Statement, what: str) -> list[tuple[str, tuple[str, ...] | None]]:
    """The objects a statement makes or names: (name, input types) for a function,
    (name, None) for a table or view."""
    fn = parse_function(st)
    if fn is not None:
        return [(fn.name, fn.input_types)]
    toks = st.tokens
    words = [t.value if t.kind == "word" else t.text for t in toks]
    if not words:
        return []
    head = words[0]
    if head == "create":
        i = 1
        if words[i : i + 2] == ["or", "replace"]:
            i += 2
        if words[i] in ("table", "view"):
            return [_name_and_types(toks, i + 1, what)[:1] + (None,)]
        return []
    if head in ("comment", "alter"):
        i = 3 if head == "comment" else 2
        kind = words[i - 1]
        if kind == "column":
            return [(_name_and_types(toks, i, what)[0], None)]
        if kind in ("function", "table", "view"):
            name, types = _name_and_types(toks, i, what)
            return [(name, types if kind == "function" else None)]
        return []
    if head in ("grant", "revoke"):
        on = words.index("on")
        kind = words[on + 1]
        if kind in ("function", "table"):
            name, types = _name_and_types(toks, on + 2, what)
            return [(name, types if kind == "function" else None)]
        return []
    if head == "select" and "pg_extension_config_dump" in words:
        lit = next(t for t in toks if t.kind == "string")
        return [(lit.value.split(".")[-1], None)]
    if head == "insert":
        return [(_name_and_types(toks, 2, what)[0], None)]
    return []


def _paragraph(st: Statement, library: bool) -> str:
    """The statement's code, after the comment paragraph right above it (none for the
    generated script, whose comments say only where pgrx found each item)."""
    first = next(s for s, e, kind in lex(st.text) if kind not in ("ws", "comment"))
    code = st.text[first:]
    if library:
        # Without pgrx's notes of the Rust types, which say nothing to PostgreSQL.
        code = "".join(code[s:e] for s, e, kind in lex(code) if kind != "comment")
        return "\n".join(line.rstrip() for line in code.split("\n"))
    comments = []
    # The comment lines that end right where the statement starts (a blank line between
    # them and it ends the paragraph: a file's header is not the statement's).
    for line in reversed(st.text[:first].split("\n")[:-1]):
        if not line.strip().startswith("--"):
            break
        comments.append(line.strip())
    return "".join(c + "\n" for c in reversed(comments)) + code


def _or_replace(code: str) -> str:
    return re.sub(r"^(\s*(?:--[^\n]*\n)*\s*)CREATE\s+(FUNCTION|VIEW)\b", r"\1CREATE OR REPLACE \2", code,
                  count=1, flags=re.I)


def _selector(text: str, what: str):
    m = re.fullmatch(r"\s*(?:dedup\.)?([a-z_][a-z0-9_]*)\s*(?:\((.*)\))?\s*", text, re.S)
    if not m:
        raise BuildError(f"{what}: '{text}' is not dedup.NAME or dedup.NAME(TYPE, ...)")
    if m.group(2) is None:
        return m.group(1), None
    toks = [portable._token(m.group(2), s, e, k) for s, e, k in lex(m.group(2)) if k not in ("ws", "comment")]
    return m.group(1), _types(toks)


def assemble(recipe_path: str, library_path: str | None) -> tuple[str, str]:
    """The upgrade script a recipe makes, and the path it belongs at."""
    recipe_name = os.path.relpath(os.path.realpath(recipe_path), REPO)
    lines = _read(recipe_path).split("\n")
    versions = None
    sources: dict[str, list[Statement]] = {}
    out: list[str] = []
    used = set()
    for n, line in enumerate(lines, 1):
        where = f"{recipe_name}:{n}"
        if not line.startswith("--@"):
            out.append(line)
            continue
        words = line[3:].split(None, 2)
        if words and words[0] == "upgrade" and len(words) == 3 and versions is None:
            versions = (words[1], words[2].strip())
            continue
        if versions is None:
            raise BuildError(f"{where}: the first directive is '--@ upgrade OLD NEW'")
        if len(words) != 3 or words[0] not in ("create", "replace"):
            raise BuildError(f"{where}: '{line}' is not '--@ create|replace SOURCE OBJECT'")
        verb, source, obj = words
        library = source == "library"
        if source not in sources:
            path = library_path if library else os.path.join(SQL, source)
            if library and path is None:
                raise BuildError(f"{where}: the generated install script is needed (--library)")
            if not library and path not in concern_files():
                raise BuildError(f"{where}: {source} is not a concern file of sql/")
            sources[source], _ = split_statements(_read(path), source)
            if library:
                # What src/ declares: the generated script without the concern files' text.
                concern = {st.code for f in concern_files() for st in
                           split_statements(_read(f), f)[0]}
                sources[source] = [st for st in sources[source] if st.code not in concern]
        picked = []
        if obj.strip() == "*":
            picked = list(sources[source])
        else:
            name, types = _selector(obj, where)
            for st in sources[source]:
                for t_name, t_types in targets(st, source):
                    if t_name == name and (types is None or t_types is None or t_types == types):
                        picked.append(st)
                        break
        if library:
            # pgrx orders what it generates differently from one build to the next.
            picked.sort(key=lambda st: (parse_function(st) is None, st.code))
        if not picked:
            raise BuildError(f"{where}: {source} has no statement that makes or names {obj.strip()}")
        for st in picked:
            key = (source, id(st))
            if key in used:
                raise BuildError(f"{where}: a statement of {source} is taken twice: {st.code[:60]}")
            used.add(key)
            code = _paragraph(st, library)
            if verb == "replace":
                code = _or_replace(code)
            if code.startswith("--") and out and out[-1].strip() and not out[-1].startswith("--"):
                out.append("")
            out.append(code)
    if versions is None:
        raise BuildError(f"{recipe_name}: no '--@ upgrade OLD NEW' directive")
    old, new = versions
    if os.path.basename(recipe_path) != f"{new}.sql":
        raise BuildError(f"{recipe_name}: the recipe of the upgrade to {new} is sql/upgrade/{new}.sql")
    text = GENERATED.format(recipe=recipe_name) + "\n".join(out).rstrip("\n") + "\n"
    return text, os.path.join(SQL, f"{portable.EXTENSION}--{old}--{new}.sql")


def concern_files() -> list[str]:
    return sorted(os.path.join(SQL, f) for f in os.listdir(SQL)
                  if f.endswith(".sql") and not f.startswith(f"{portable.EXTENSION}--"))


def default_library(new: str) -> str:
    pg_config = os.environ.get("DEDUP_PG_CONFIG") or "pg_config"
    share = subprocess.run([pg_config, "--sharedir"], check=True, capture_output=True, text=True).stdout.strip()
    return os.path.join(share, "extension", f"{portable.EXTENSION}--{new}.sql")


def objects(files: dict[str, str]) -> dict[tuple, tuple[str, str, list[str]]]:
    """Every object the concern files make or name: (name, input types or None) -> (its
    file, its kind: function, view, table, and the code of each statement that names it)."""
    out: dict[tuple, tuple[str, str, list[str]]] = {}
    for source in sorted(files):
        for st in split_statements(files[source], source)[0]:
            kind = "function" if parse_function(st) is not None else None
            if kind is None:
                words = [t.value for t in st.tokens[:4] if t.kind == "word"]
                kind = next((w for w in words if w in ("table", "view")), None)
            for key in targets(st, source):
                have = out.setdefault(key, (source, kind, []))
                if have[1] is None and kind is not None:
                    out[key] = have = (have[0], kind, have[2])
                have[2].append(st.code)
    return out


def _object_name(key: tuple) -> str:
    name, types = key
    return f"dedup.{name}" + ("" if types is None else f"({', '.join(types)})")


def propose(old_files: dict[str, str], new_files: dict[str, str]) -> list[str]:
    """The directives of the next recipe: what the concern files make or change since
    old_files (file name -> text)."""
    old, new = objects(old_files), objects(new_files)
    lines = []
    for key in sorted(new, key=lambda k: (new[k][0], k[0], k[1] or ())):
        source, kind, codes = new[key]
        if key not in old:
            lines.append(f"--@ create {source} {_object_name(key)}")
        elif old[key][2] != codes:
            if kind in ("function", "view"):
                lines.append(f"--@ replace {source} {_object_name(key)}")
            else:
                lines.append(f"-- {_object_name(key)} ({kind or 'object'}) changed in {source}: "
                             "write its ALTER by hand")
    for key in sorted(set(old) - set(new), key=lambda k: (k[0], k[1] or ())):
        kind = old[key][1] or "object"
        lines.append(f"DROP {kind.upper()} {_object_name(key)};  -- gone from {old[key][0]}")
    return lines


def _files_at(rev: str) -> dict[str, str]:
    listing = subprocess.run(["git", "-C", REPO, "ls-tree", "--name-only", f"{rev}:sql"],
                             check=True, capture_output=True, text=True).stdout.split()
    return {f: subprocess.run(["git", "-C", REPO, "show", f"{rev}:sql/{f}"], check=True,
                              capture_output=True, text=True).stdout
            for f in listing if f.endswith(".sql") and not f.startswith(f"{portable.EXTENSION}--")}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--propose"]:
        if len(argv) != 2:
            print("usage: upgrade-script.py --propose REV", file=sys.stderr)
            return 2
        try:
            old = _files_at(argv[1])
            new = {os.path.basename(f): _read(f) for f in concern_files()}
            lines = propose(old, new)
            print("\n".join(lines)) if lines else print(f"upgrade-script.py: no object of the concern files changed since {argv[1]}", file=sys.stderr)
        except (BuildError, OSError, subprocess.CalledProcessError) as e:
            print(f"upgrade-script.py: {(getattr(e, 'stderr', None) or str(e)).strip()}", file=sys.stderr)
            return 1
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--library", help="the install script pgrx generated (dedup--NEW.sql)")
    parser.add_argument("--check", action="store_true", help="compare with the committed script")
    args = parser.parse_args(argv)
    try:
        new = os.path.basename(args.recipe)[: -len(".sql")]
        library = args.library or default_library(new)
        text, target = assemble(args.recipe, library)
    except (BuildError, OSError, subprocess.CalledProcessError) as e:
        print(f"upgrade-script.py: {e}", file=sys.stderr)
        return 1
    if args.check:
        have = _read(target) if os.path.exists(target) else ""
        if have != text:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                                       os.path.relpath(target, REPO), "from the recipe"))
            print(f"upgrade-script.py: {os.path.relpath(target, REPO)} is not what {os.path.relpath(os.path.realpath(args.recipe), REPO)} makes: "
                  f"run python3 scripts/upgrade-script.py {os.path.relpath(os.path.realpath(args.recipe), REPO)}", file=sys.stderr)
            return 1
        return 0
    with open(target, "w", encoding="utf-8") as f:
        f.write(text)
    print(os.path.relpath(target, REPO))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
