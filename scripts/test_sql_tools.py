#!/usr/bin/env python3
"""Unit tests of the SQL reading that scripts/portable.py and scripts/upgrade-script.py do:
the lexer and statement splitter, type and header normalization, the matching of a native
function's header with its portable counterpart, and which statements name an object.

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


if __name__ == "__main__":
    unittest.main()
