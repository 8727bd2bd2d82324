#!/usr/bin/env python3
"""Unit tests of the SQL reading that scripts/portable.py and scripts/upgrade-script.py do:
the lexer and statement splitter, type and header normalization, the matching of a native
function's header with its portable counterpart, and which statements name an object; and
of scripts/check-errors.py: what it reads as a hint or detail, in the sources and in the
catalogue, and what it fails on.

    python3 scripts/test_sql_tools.py        (scripts/test.sh runs it first)

Python 3 standard library only; no server.
"""
import importlib.util
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import portable  # noqa: E402
from portable import BuildError, lex, parse_function, split_statements  # noqa: E402

_spec = importlib.util.spec_from_file_location("upgrade_script", os.path.join(HERE, "upgrade-script.py"))
upgrade_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(upgrade_script)

_spec = importlib.util.spec_from_file_location("check_errors", os.path.join(HERE, "check-errors.py"))
check_errors = importlib.util.module_from_spec(_spec)
sys.modules["check_errors"] = check_errors  # its dataclasses look their module up
_spec.loader.exec_module(check_errors)
GAP = check_errors.GAP


def kinds(sql):
    return [(sql[s:e], k) for s, e, k in lex(sql) if k != "ws"]


def one(sql):
    statements, rest = split_statements(sql, "test")
    assert len(statements) == 1, statements
    return statements[0]


class Lexer(unittest.TestCase):
    def test_semicolons_inside_quotes_comments_and_bodies_do_not_end_a_statement(self):
        sql = """SELECT ';' AS a, "x;y" -- c;
        /* b; /* nested; */ still; */ FROM t;
        CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; SELECT 2; $body$;
        DO $$ BEGIN RAISE NOTICE 'a;b'; END $$;"""
        statements, rest = split_statements(sql, "test")
        self.assertEqual(len(statements), 3)
        self.assertEqual(rest, "")
        self.assertTrue(statements[1].text.strip().startswith("CREATE FUNCTION"))

    def test_dollar_tags_must_match(self):
        st = one("SELECT $a$ $$ not the end $b$ $a$;")
        self.assertEqual([t.kind for t in st.tokens], ["word", "dollar"])
        self.assertEqual(st.tokens[1].value, " $$ not the end $b$ ")

    def test_a_dollar_inside_an_identifier_is_not_a_quote(self):
        self.assertEqual(kinds("a$b$ $1"), [("a$b$", "word"), ("$1", "param")])

    def test_doubled_quotes_and_escape_strings(self):
        self.assertEqual(one("SELECT 'it''s';").tokens[1].value, "it's")
        self.assertEqual(one('SELECT "a""b";').tokens[1].value, 'a"b')
        # In E'...' a backslash escapes the quote (the E is no word of its own); in '...' it
        # does not.
        self.assertEqual(kinds(r"E'a\'b' 'c\'"), [(r"'a\'b'", "string"), (r"'c\'", "string")])

    def test_unterminated_text_is_an_error_not_a_guess(self):
        for sql in ("SELECT 'x;", 'SELECT "x;', "SELECT $q$ x;", "/* x;"):
            with self.subTest(sql=sql), self.assertRaises(BuildError):
                list(lex(sql))

    def test_a_statement_without_its_semicolon_is_an_error(self):
        with self.assertRaises(BuildError):
            split_statements("SELECT 1; SELECT 2", "test")

    def test_comments_before_a_statement_stay_with_it(self):
        statements, rest = split_statements("-- one\nSELECT 1;\n-- two\nSELECT 2;\n-- tail\n", "test")
        self.assertIn("-- two", statements[1].text)
        self.assertEqual(rest, "\n-- tail\n")
        self.assertEqual(statements[1].code, "SELECT 2")


class Headers(unittest.TestCase):
    def test_types_are_normalized(self):
        for a, b in [("pg_catalog.text", "TEXT"), ("bigint", "int8"), ("integer[]", "int4[]"),
                     ("timestamp with time zone", "timestamptz"), ("double precision", "float8"),
                     ("character varying(10)", "varchar(10)")]:
            with self.subTest(a=a):
                fa = parse_function(one(f"CREATE FUNCTION dedup.f(x {a}) RETURNS void LANGUAGE sql AS $$ $$;"))
                fb = parse_function(one(f"CREATE FUNCTION f(x {b}) RETURNS void LANGUAGE sql AS $$ $$;"))
                self.assertEqual(fa.input_types, fb.input_types)

    def test_a_header_is_read_whole(self):
        fn = parse_function(one("""CREATE OR REPLACE FUNCTION dedup.lease(
            job_id pg_catalog.text, scope pg_catalog.text DEFAULT 'default',
            OUT status pg_catalog.text, OUT expires_at pg_catalog.timestamptz)
            RETURNS record LANGUAGE plpgsql STABLE PARALLEL SAFE SECURITY DEFINER STRICT
            SET search_path = pg_catalog, pg_temp AS $$ BEGIN END $$;"""))
        self.assertTrue(fn.or_replace)
        self.assertEqual(fn.key, ("lease", ("text", "text")))
        self.assertEqual(fn.returns, "record(status text, expires_at timestamptz)")
        self.assertEqual(fn.language, "plpgsql")
        self.assertEqual(fn.attrs["volatility"], "stable")
        self.assertEqual(fn.attrs["parallel"], "safe")
        self.assertEqual(fn.attrs["security"], "definer")
        self.assertEqual(fn.attrs["strict"], "strict")
        self.assertEqual(fn.attrs["set"], "search_path = pg_catalog, pg_temp")

    def test_pgrx_headers_match_their_hand_written_counterparts(self):
        native = parse_function(one('''CREATE  FUNCTION "try_claim_many"(
            "job_ids" TEXT[], /* Vec<&str> */
            "scope" TEXT DEFAULT 'default' /* &str */
        ) RETURNS SETOF TEXT /* String */
        VOLATILE PARALLEL UNSAFE
        LANGUAGE c /* Rust */
        AS 'MODULE_PATHNAME', 'try_claim_many_text_wrapper';'''))
        mine = parse_function(one("""CREATE FUNCTION dedup.try_claim_many(job_ids pg_catalog.text[],
            scope pg_catalog.text DEFAULT 'default') RETURNS SETOF pg_catalog.text
            LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE AS $$ BEGIN END $$;"""))
        self.assertEqual(native.language, "c")
        self.assertEqual(portable.header_differences(native, mine), [])

    def test_header_differences_are_named(self):
        native = parse_function(one("CREATE FUNCTION f(a text DEFAULT 'x') RETURNS bool STRICT LANGUAGE c AS 'm', 'f';"))
        for other, what in [
            ("CREATE FUNCTION f(b text DEFAULT 'x') RETURNS bool STRICT LANGUAGE sql AS $$ $$;", "argument 1"),
            ("CREATE FUNCTION f(a text DEFAULT 'y') RETURNS bool STRICT LANGUAGE sql AS $$ $$;", "argument 1"),
            ("CREATE FUNCTION f(a text DEFAULT 'x') RETURNS int4 STRICT LANGUAGE sql AS $$ $$;", "returns"),
            ("CREATE FUNCTION f(a text DEFAULT 'x') RETURNS bool LANGUAGE sql AS $$ $$;", "strict"),
            ("CREATE FUNCTION f(a text DEFAULT 'x') RETURNS bool STRICT STABLE LANGUAGE sql AS $$ $$;", "volatility"),
        ]:
            with self.subTest(other=other):
                diffs = portable.header_differences(native, parse_function(one(other)))
                self.assertTrue(any(d.startswith(what) for d in diffs), diffs)

    def test_a_function_of_another_schema_is_refused(self):
        with self.assertRaises(BuildError):
            parse_function(one("CREATE FUNCTION public.f() RETURNS void LANGUAGE sql AS $$ $$;"))

    def test_an_unknown_header_word_is_refused(self):
        with self.assertRaises(BuildError):
            parse_function(one("CREATE FUNCTION f() RETURNS void LANGUAGE sql TRANSFORM FOR TYPE x AS $$ $$;"))


class UpgradeScript(unittest.TestCase):
    def targets(self, sql):
        return upgrade_script.targets(one(sql), "test")

    def test_which_object_a_statement_names(self):
        self.assertEqual(self.targets("CREATE OR REPLACE FUNCTION dedup.f(a pg_catalog.int8, b text) RETURNS void LANGUAGE sql AS $$ $$;"),
                         [("f", ("int8", "text"))])
        self.assertEqual(self.targets("CREATE TABLE dedup.t (a int);"), [("t", None)])
        self.assertEqual(self.targets("CREATE VIEW dedup.v AS SELECT 1;"), [("v", None)])
        self.assertEqual(self.targets("COMMENT ON FUNCTION dedup.f(bigint) IS 'x';"), [("f", ("int8",))])
        self.assertEqual(self.targets("COMMENT ON COLUMN dedup.t.a IS 'x';"), [("t", None)])
        self.assertEqual(self.targets("REVOKE ALL ON FUNCTION dedup.f() FROM PUBLIC;"), [("f", ())])
        self.assertEqual(self.targets("GRANT SELECT ON TABLE dedup.t TO pg_monitor;"), [("t", None)])
        self.assertEqual(self.targets("GRANT USAGE ON SCHEMA dedup TO PUBLIC;"), [])
        self.assertEqual(self.targets("ALTER TABLE dedup.t REPLICA IDENTITY FULL;"), [("t", None)])
        self.assertEqual(self.targets("SELECT pg_catalog.pg_extension_config_dump('dedup.t', '');"), [("t", None)])
        self.assertEqual(self.targets("INSERT INTO dedup.t (a) VALUES (1);"), [("t", None)])
        self.assertEqual(self.targets("DO $$ BEGIN END $$;"), [])

    def assemble(self, recipe, concern, library="", name="9.9.9.sql"):
        with tempfile.TemporaryDirectory() as d:
            sql = os.path.join(d, "sql")
            os.makedirs(os.path.join(sql, "upgrade"))
            with open(os.path.join(sql, "things.sql"), "w") as f:
                f.write(concern)
            with open(os.path.join(d, "library.sql"), "w") as f:
                f.write(library)
            path = os.path.join(sql, "upgrade", name)
            with open(path, "w") as f:
                f.write(recipe)
            old = upgrade_script.SQL, upgrade_script.REPO
            upgrade_script.SQL, upgrade_script.REPO = sql, d
            try:
                text, target = upgrade_script.assemble(path, os.path.join(d, "library.sql"))
            finally:
                upgrade_script.SQL, upgrade_script.REPO = old
            return text, os.path.basename(target)

    CONCERN = """-- The file's header.

-- What f does.
CREATE FUNCTION dedup.f(a pg_catalog.text) RETURNS void LANGUAGE sql AS $$ SELECT 1; $$;
CREATE FUNCTION dedup.f(a pg_catalog.int8) RETURNS void LANGUAGE sql AS $$ SELECT 2 $$;

CREATE FUNCTION dedup.g() RETURNS void LANGUAGE sql AS $$ $$;
REVOKE ALL ON FUNCTION dedup.f(pg_catalog.text) FROM PUBLIC;
COMMENT ON FUNCTION dedup.g() IS 'g';
"""

    def test_a_recipe_takes_each_definition_from_its_concern_file(self):
        text, target = self.assemble("--@ upgrade 9.9.8 9.9.9\n\\echo x \\quit\n--@ replace things.sql dedup.f(text)\nDROP VIEW dedup.v;\n--@ create things.sql dedup.g\n",
                                     self.CONCERN)
        self.assertEqual(target, "dedup--9.9.8--9.9.9.sql")
        body = text.split("\n", 1)[1]
        self.assertEqual(body, """\\echo x \\quit

-- What f does.
CREATE OR REPLACE FUNCTION dedup.f(a pg_catalog.text) RETURNS void LANGUAGE sql AS $$ SELECT 1; $$;
REVOKE ALL ON FUNCTION dedup.f(pg_catalog.text) FROM PUBLIC;
DROP VIEW dedup.v;
CREATE FUNCTION dedup.g() RETURNS void LANGUAGE sql AS $$ $$;
COMMENT ON FUNCTION dedup.g() IS 'g';
""")
        self.assertNotIn("header", text)

    def test_the_library_gives_what_src_declares_without_pgrx_notes(self):
        library = self.CONCERN + """
/* <begin connected objects> */
-- src/x.rs:1
CREATE  FUNCTION "h"(
	"a" TEXT /* &str */
) RETURNS void /* () */
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'h_wrapper';
"""
        text, _ = self.assemble("--@ upgrade 1 9.9.9\n--@ create library dedup.h\n", self.CONCERN, library)
        self.assertIn('CREATE  FUNCTION "h"(\n\t"a" TEXT\n) RETURNS void\nLANGUAGE c\nAS', text)
        # The concern file's text in the generated script is not the library's.
        with self.assertRaises(BuildError):
            self.assemble("--@ upgrade 1 9.9.9\n--@ create library dedup.g\n", self.CONCERN, library)

    def test_a_recipe_that_names_nothing_or_something_twice_is_refused(self):
        for recipe in ("--@ upgrade 1 9.9.9\n--@ create things.sql dedup.nothing\n",
                       "--@ upgrade 1 9.9.9\n--@ create things.sql dedup.g\n--@ create things.sql dedup.g\n",
                       "--@ upgrade 1 9.9.9\n--@ create other.sql dedup.g\n",
                       "--@ upgrade 1 9.9.9\n--@ include things.sql dedup.g\n",
                       "--@ create things.sql dedup.g\n"):
            with self.subTest(recipe=recipe), self.assertRaises(BuildError):
                self.assemble(recipe, self.CONCERN)
        with self.assertRaises(BuildError):
            self.assemble("--@ upgrade 1 9.9.8\n", self.CONCERN)  # not the file's version


class Propose(unittest.TestCase):
    OLD = {"things.sql": """
CREATE TABLE dedup.t (a int);
CREATE FUNCTION dedup.f(a pg_catalog.text) RETURNS void LANGUAGE sql AS $$ SELECT 1 $$;
CREATE FUNCTION dedup.gone() RETURNS void LANGUAGE sql AS $$ $$;
CREATE VIEW dedup.v AS SELECT 1;
COMMENT ON FUNCTION dedup.f(text) IS 'f';
"""}

    def test_each_change_since_the_release_is_named_once(self):
        new = {"things.sql": """
-- Comments and layout are not changes.
CREATE TABLE dedup.t (a int, b int);
CREATE FUNCTION dedup.f(a pg_catalog.text)
    RETURNS void LANGUAGE sql AS $$ SELECT 1 $$;
CREATE VIEW dedup.v AS SELECT 2;
COMMENT ON FUNCTION dedup.f(text) IS 'f';
""", "more.sql": """
CREATE FUNCTION dedup.h(a pg_catalog.int8) RETURNS void LANGUAGE sql AS $$ $$;
REVOKE ALL ON FUNCTION dedup.h(bigint) FROM PUBLIC;
"""}
        self.assertEqual(upgrade_script.propose(self.OLD, new), [
            "--@ create more.sql dedup.h(int8)",
            "-- dedup.t (table) changed in things.sql: write its ALTER by hand",
            "--@ replace things.sql dedup.v",
            "DROP FUNCTION dedup.gone();  -- gone from things.sql",
        ])

    def test_a_grant_or_comment_changed_is_a_change_of_its_object(self):
        new = {"things.sql": self.OLD["things.sql"].replace("IS 'f'", "IS 'f, again'")}
        self.assertEqual(upgrade_script.propose(self.OLD, new), ["--@ replace things.sql dedup.f(text)"])
        self.assertEqual(upgrade_script.propose(self.OLD, self.OLD), [])


class CheckErrors(unittest.TestCase):
    """scripts/check-errors.py on a small native library, concern file, portable edition
    and catalogue that agree; each test breaks one thing."""

    RUST = r"""
pub fn null_argument(func: &str, arg: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED,
        format!("{func}: {arg} must not be NULL"),
        if matches!(arg, "stream" | "partition") {
            "Pass the stream's name and the partition's number."
        } else if arg == "scope" {
            "Pass a scope name; the scope of claims made without one is 'default'."
        } else {
            "A job without an id cannot be deduplicated: pass the message's unique \
             id."
        },
    )
}

pub fn read_only(func: &str) -> ! {
    let refused = WriteRefused::of(func);
    raise(
        PgSqlErrorCode::ERRCODE_READ_ONLY_SQL_TRANSACTION,
        format!("{func}: cannot {} in a read-only transaction", refused.verb),
        refused.read_only_hint,
    )
}

impl WriteRefused {
    fn of(func: &str) -> Self {
        match func {
            "dedup.prune" => WriteRefused { verb: "prune",
                read_only_hint: "Pruning deletes claims: call it in a READ WRITE transaction." },
            _ => WriteRefused { verb: "claim", read_only_hint: "Run the claim in a READ WRITE transaction." },
        }
    }
}

pub fn warn_outside(func: &'static str) {
    let _c = '\'';
    ErrorReport::new(PgSqlErrorCode::ERRCODE_WARNING, format!("{func}: outside a transaction block"), "dedup")
        .set_detail("The claim has committed on its own.")
        .set_hint("Call it between BEGIN and COMMIT.")
        .report(PgLogLevel::WARNING);
}
"""

    CONCERN = """
CREATE FUNCTION dedup.advance(s text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM dedup._raise('42501', pg_catalog.format('dedup.advance: stream %L is not yours', s),
        pg_catalog.format('Advance it as %1$s (GRANT %1$s TO you).', 'o'));
    RAISE EXCEPTION USING ERRCODE = '55000', MESSAGE = 'dedup.advance: not here',
        DETAIL = 'It holds: ' || s || '.', HINT = 'Call it on the coordinator.';
END $$;
"""

    PORTABLE = """
CREATE FUNCTION dedup._portable_error(kind text, func text, arg text) RETURNS bool
LANGUAGE plpgsql AS $$
DECLARE
    code text;
    msg  text;
    hint text;
BEGIN
    CASE kind
    WHEN 'null' THEN
        code := '22004';
        msg := format('%s: %s must not be NULL', func, arg);
        hint := CASE WHEN arg = 'scope' THEN 'Pass a scope name; the scope of claims made without one is ''default''.'
                ELSE 'A job without an id cannot be deduplicated: pass the message''s '
                     'unique id.' END;
    WHEN 'read_only' THEN
        code := '25006';
        msg := format('%s: cannot %s in a read-only transaction', func, 'claim');
        hint := 'Run the claim in a READ WRITE transaction.';
    END CASE;
    RAISE EXCEPTION USING ERRCODE = code, MESSAGE = msg, HINT = hint;
END $$;

CREATE FUNCTION dedup._portable_stats_warning(func text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE WARNING USING MESSAGE = format('%s: the portable edition keeps no counters', func),
        HINT = 'Read dedup.table_health() instead.';
END $$;
"""

    PYTHON = "\n".join([
        "def build_plain(version):",
        '    body = f"""',
        "BEGIN",
        "    RAISE EXCEPTION USING ERRCODE = '55P03', MESSAGE = 'dedup.plain.sql: another session runs it',",
        "        HINT = 'Run it again once that session is done ({version}).';",
        "END",
        '"""',
        "    return body",
    ])

    CATALOGUE = """# Errors

| SQLSTATE | When | Hint | Raised by |
|---|---|---|---|
| `22004` | a NULL | `job_id`: A job without an id cannot be deduplicated: pass the message's unique id. `stream`, `partition`: Pass the stream's name and the partition's number. Other `scope`: Pass a scope name; the scope of claims made without one is 'default'. | all |
| `25006` | read-only | Read-only: Run the claim in a READ WRITE transaction. `prune`: Pruning deletes claims: call it in a READ WRITE transaction. | claims |
| `42501` | another's stream | Advance it as *owner* (GRANT *owner* TO you). (PostgreSQL's own: no hint) | `advance` |
| `55000` | on a worker | Call it on the coordinator. Detail: It holds: *each object*. | `advance` |

## Warnings

| SQLSTATE | When | Message, detail and hint |
|---|---|---|
| `01000` | outside a block | `dedup.try_claim: outside a transaction block`. Detail: The claim has committed on its own. Hint: Call it between BEGIN and COMMIT. |

## The portable edition's own errors

| SQLSTATE | When | Message, detail and hint |
|---|---|---|
| `01000` | its counters | `dedup.stats: the portable edition keeps no counters`. Hint: Read dedup.table_health() instead. |
| `55P03` | `dedup.plain.sql` twice at once | `dedup.plain.sql: another session runs it`. Hint: Run it again once that session is done (0.6.0). |

## Examples

```text
ERROR:  22004: dedup.try_claim: job_id must not be NULL
HINT:  A job without an id cannot be deduplicated: pass the message's unique id.
```
"""

    def sites(self, rust=RUST, concern=CONCERN, portable_sql=PORTABLE, python=PYTHON):
        ce = check_errors
        sites = ce.rust_sites(rust, "src/error.rs")
        sites += ce.sql_sites(concern, "sql/offsets.sql", "native")
        sites += ce.sql_sites(portable_sql, "sql/portable/helpers.sql", "portable")
        for line, text in ce.python_sql(python):
            sites += ce.sql_sites(text, "scripts/portable.py", "portable", line - 1)
        return sites

    def problems(self, catalogue=CATALOGUE, **sources):
        problems, _ = check_errors.check(self.sites(**sources), catalogue)
        return problems

    def assertFails(self, problems, *words):
        self.assertTrue(any(all(w in p for w in words) for p in problems), problems)

    # What is read.

    def test_the_native_library_is_read_by_its_calls(self):
        problems = []
        sites = check_errors.rust_sites(self.RUST, "src/error.rs", problems)
        self.assertEqual(problems, [])
        null, read_only, warn = sites
        self.assertEqual((null.sqlstate, null.messages), ("22004", [f"{GAP}: {GAP} must not be NULL"]))
        # The strings matches! and == compare are no hints; a continued line is one.
        self.assertEqual(null.hints, [
            "Pass the stream's name and the partition's number.",
            "Pass a scope name; the scope of claims made without one is 'default'.",
            "A job without an id cannot be deduplicated: pass the message's unique id."])
        # A field: every string written as it.
        self.assertEqual(read_only.hints, ["Pruning deletes claims: call it in a READ WRITE transaction.",
                                           "Run the claim in a READ WRITE transaction."])
        self.assertEqual((warn.sqlstate, warn.details, warn.hints),
                         ("01000", ["The claim has committed on its own."], ["Call it between BEGIN and COMMIT."]))

    def test_a_long_string_of_error_rs_the_reading_misses_is_a_failure(self):
        rust = self.RUST + """
pub fn other(func: &str) -> ! {
    let hint = "A hint this reading does not see as one.";
    raise(PgSqlErrorCode::ERRCODE_WARNING, format!("{func}: other"), hint)
}
"""
        problems = []
        check_errors.rust_sites(rust, "src/error.rs", problems)
        self.assertFails(problems, "src/error.rs:", "A hint this reading does not see")

    def test_sql_texts_are_literals_cases_formats_and_concatenations(self):
        advance, worker = check_errors.sql_sites(self.CONCERN, "sql/offsets.sql", "native")
        self.assertEqual((advance.where, advance.sqlstate), ("sql/offsets.sql:4", "42501"))
        self.assertEqual(advance.messages, [f"dedup.advance: stream {GAP} is not yours"])
        self.assertEqual(advance.hints, [f"Advance it as {GAP} (GRANT {GAP} TO you)."])
        self.assertEqual((worker.sqlstate, worker.details, worker.hints),
                         ("55000", [f"It holds: {GAP}."], ["Call it on the coordinator."]))
        null, read_only, stats = check_errors.sql_sites(self.PORTABLE, "p.sql", "portable")
        self.assertEqual((null.sqlstate, null.messages), ("22004", [f"{GAP}: {GAP} must not be NULL"]))
        self.assertEqual(null.hints, ["Pass a scope name; the scope of claims made without one is 'default'.",
                                      "A job without an id cannot be deduplicated: pass the message's unique id."])
        self.assertEqual((read_only.sqlstate, stats.sqlstate), ("25006", "01000"))

    def test_the_sql_of_python_strings_is_read_with_gaps_for_their_fields(self):
        [(line, text)] = list(check_errors.python_sql(self.PYTHON))
        [site] = check_errors.sql_sites(text, "scripts/portable.py", "portable", line - 1)
        self.assertEqual((site.where, site.sqlstate), ("scripts/portable.py:4", "55P03"))
        self.assertEqual(site.hints, [f"Run it again once that session is done ({GAP})."])

    # What is checked.

    def test_a_catalogue_that_agrees_with_the_sources_passes(self):
        self.assertEqual(self.problems(), [])
        pairs = {p.where: [n.where for n in natives] for p, natives in check_errors.pairs(self.sites())}
        self.assertEqual(pairs, {"sql/portable/helpers.sql:13": ["src/error.rs:3"],
                                 "sql/portable/helpers.sql:19": ["src/error.rs:19"],
                                 "sql/portable/helpers.sql:26": [],
                                 "scripts/portable.py:4": []})

    def test_a_stale_hint_in_the_catalogue_fails(self):
        stale = self.CATALOGUE.replace("`prune`: Pruning", "Standby: Connect to the primary. `prune`: Pruning")
        self.assertFails(self.problems(stale), "errors.md:6", "no source raises", "Standby: Connect to the primary.")
        # The rest of a hint, a stale example, a stale detail.
        self.assertFails(self.problems(self.CATALOGUE.replace("coordinator.", "coordinator, or else.")),
                         "errors.md:8", "Call it on the coordinator, or else.")
        self.assertFails(self.problems(self.CATALOGUE.replace("unique id.\n```", "unique id!\n```")),
                         "errors.md:27", "no source raises")
        self.assertFails(self.problems(self.CATALOGUE.replace(
            "Detail: The claim has committed on its own.", "Detail: The claim has committed.")),
            "a detail in the catalogue that no source raises", "The claim has committed.")

    def test_a_raised_hint_the_catalogue_lacks_fails(self):
        problems = self.problems(self.CATALOGUE.replace(
            " `prune`: Pruning deletes claims: call it in a READ WRITE transaction.", ""))
        self.assertFails(problems, "src/error.rs:", "not in docs/reference/errors.md", "Pruning deletes claims")
        problems = self.problems(self.CATALOGUE.replace(" Detail: It holds: *each object*.", ""))
        self.assertFails(problems, "sql/offsets.sql:6", "not in", "It holds: …")

    def test_a_hint_written_as_a_detail_fails(self):
        problems = self.problems(self.CATALOGUE.replace("Hint: Call it between", "Detail: Call it between"))
        self.assertFails(problems, "written as a detail, raised as a hint", "Call it between BEGIN")

    def test_what_only_the_portable_edition_raises_is_under_its_heading(self):
        moved = self.CATALOGUE.replace("## The portable edition's own errors", "## More warnings")
        self.assertFails(self.problems(moved), "sql/portable/helpers.sql:26", "portable edition only",
                         "Read dedup.table_health() instead.")
        self.assertFails(self.problems(moved), "scripts/portable.py:4", "portable edition only")
        native = self.CATALOGUE.replace("Hint: Read dedup.table_health() instead.",
                                        "Hint: Read dedup.table_health() instead. Hint: Call it on the coordinator.")
        self.assertFails(self.problems(native), "errors.md:20", "the native edition raises it too")

    def test_the_portable_raise_of_a_native_message_gives_the_native_sqlstate_and_hint(self):
        other_hint = self.PORTABLE.replace(
            "hint := 'Run the claim in a READ WRITE transaction.'",
            "hint := 'Pass a scope name; the scope of claims made without one is ''default''.'")
        self.assertFails(self.problems(portable_sql=other_hint), "sql/portable/helpers.sql:19",
                         "does not give", "Pass a scope name")
        other_state = self.PORTABLE.replace("code := '25006'", "code := '55000'")
        self.assertFails(self.problems(portable_sql=other_state), "sql/portable/helpers.sql:19",
                         "SQLSTATE 55000", "25006")

if __name__ == "__main__":
    unittest.main()
