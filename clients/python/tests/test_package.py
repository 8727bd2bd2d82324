"""The package as built and installed: version, metadata, licence, typing, lazy imports."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import zipfile
from importlib import metadata

import dedup

REPO = pathlib.Path(os.environ["DEDUP_TEST_REPO"])
HERE = REPO / "clients" / "python"


def extension_version() -> str:
    cargo = (REPO / "Cargo.toml").read_text()
    return re.search(r'(?m)^\[package\][^\[]*?^version\s*=\s*"([^"]+)"', cargo).group(1)


def test_version_moves_with_the_extension():
    assert dedup.__version__ == metadata.version("dedup-client") == extension_version()
    changelog = (HERE / "CHANGELOG.md").read_text()
    assert re.search(rf"(?m)^## {re.escape(dedup.__version__)}\b", changelog), "no CHANGELOG entry"


def test_installed_from_the_wheel_not_the_sources():
    installed = pathlib.Path(dedup.__file__).resolve()
    assert "site-packages" in installed.parts, installed
    assert HERE not in installed.parents


def test_metadata_licence_and_typing():
    meta = metadata.metadata("dedup-client")
    assert meta["License-Expression"] == "PostgreSQL"
    assert meta.get_all("Requires-Dist") and all("extra ==" in r for r in meta.get_all("Requires-Dist"))
    files = {str(f) for f in metadata.files("dedup-client")}
    assert "dedup/py.typed" in files
    assert "dedup/django/migrations/0001_create_extension.py" in files
    wheel = os.environ.get("DEDUP_TEST_WHEEL")
    if wheel:
        with zipfile.ZipFile(wheel) as z:
            licence = z.read("dedup_client-%s.dist-info/licenses/LICENSE" % dedup.__version__)
        assert licence == (REPO / "LICENSE").read_bytes()  # the repository's PostgreSQL licence


def test_no_driver_is_imported_until_used():
    code = (
        "import sys, dedup, dedup.celery, dedup.django; "
        "print(sorted(m for m in ('psycopg', 'asyncpg', 'sqlalchemy', 'celery', 'django', 'kombu') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.strip() == "[]"
