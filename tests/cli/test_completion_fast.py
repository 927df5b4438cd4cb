"""Provider and model completion reads the files without pydantic (aivedio_cli/_fast_config.py): it must offer
exactly the names the full settings path offers, for every configuration that path accepts."""

from __future__ import annotations

import shutil
from decimal import Decimal
from pathlib import Path

import pytest

from aivedio_cli._fast_config import provider_models
from aivedio_engine.config import ConfigError, load_settings, merge_overrides

REPO = Path(__file__).resolve().parents[2]

EXTRA = """
[providers.sim]
adapter = "sim"
base_url = "http://127.0.0.1:18080"
[providers.sim.models.sim-v1]
resolutions = ["720p"]
price_per_second = { "720p" = "1" }
[providers.sim.models.sim-hd]
resolutions = ["720p"]
price_per_second = { "720p" = "2" }
[providers.off]
enabled = false
[providers.off.models.never-v1]
"""


def full(config: str | None, items: list[str]) -> dict[str, list[str]]:
    """What the completers offered before: the validated settings (nothing when they are refused)."""
    try:
        providers = load_settings(config, merge_overrides(items)).providers
    except ConfigError:
        return {}
    return {name: sorted(p.models) for name, p in providers.items() if p.enabled}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(__import__("os").environ):
        if name.upper().startswith("AIVEDIO_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no ./aivedio.toml unless a case writes one


CASES = {
    "built-in defaults, no file": (None, []),
    "the shipped aivedio.toml": ("shipped", []),
    "a file that adds a provider with two models and a disabled one": ("extra", []),
    "--set adds a provider over the file": ("shipped", ["providers.sim.base_url=http://127.0.0.1:9"]),
    "--set disables the file's provider": ("extra", ["providers.sim.enabled=false"]),
    "--set adds a model": ("shipped", ["providers.local.models.local-v2.max_duration_s=5"]),
    "--set alone replaces the built-in provider (refused)": (None, ["providers.sim.base_url=http://127.0.0.1:9"]),
    "--set names a missing default provider (refused)": ("shipped", ["default_provider=nope"]),
    "--set gives a bad boolean (refused)": ("shipped", ["providers.local.enabled=maybe"]),
}


@pytest.mark.parametrize("case", CASES)
def test_fast_names_equal_the_settings_names(case: str, tmp_path: Path) -> None:
    which, items = CASES[case]
    config: str | None = None
    if which == "shipped":
        shutil.copy(REPO / "aivedio.toml", tmp_path / "aivedio.toml")  # found as ./aivedio.toml
    elif which == "extra":
        config = str(tmp_path / "extra.toml")
        Path(config).write_text((REPO / "aivedio.toml").read_text() + EXTRA)
    assert provider_models(config, items) == full(config, items)


def test_the_extra_file_really_adds_names(tmp_path: Path) -> None:
    """Guards the comparison above against two equally empty answers."""
    config = tmp_path / "extra.toml"
    config.write_text((REPO / "aivedio.toml").read_text() + EXTRA)
    assert provider_models(str(config), []) == {"local": ["local-v1"], "sim": ["sim-hd", "sim-v1"]}
    assert provider_models(None, []) == {"local": ["local-v1"]}


def test_provider_environment_variables_take_the_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIVEDIO_PROVIDERS__LOCAL__ENABLED", "false")
    assert provider_models(None, []) is None


def test_tenant_names_come_from_the_embedded_file_as_the_engine_reads_them(tmp_path: Path) -> None:
    """Tenant completion in embedded mode reads the SQLite file with the standard library: the same names in the
    same order as the engine's own read, nothing created when the file is missing, and the full path whenever
    the database is not embedded or the environment may move it."""
    from aivedio_cli._fast_config import embedded_database, embedded_tenant_names

    assert embedded_database(None, []) == Path(".aivedio") / "aivedio.db"
    assert embedded_tenant_names(Path(".aivedio") / "aivedio.db") == [] and not Path(".aivedio").exists()
    db = embedded_database(None, [f"data_dir={tmp_path / 'data'}"])
    assert db == tmp_path / "data" / "aivedio.db"
    assert embedded_database(None, ["database.url=postgresql+psycopg://u@h/db"]) is None

    engine_names = _seed_tenants(tmp_path / "data")
    assert embedded_tenant_names(db) == engine_names and set(engine_names) >= {"zeta", "acme", "mid"}


def test_tenant_names_come_from_the_server_as_the_engine_reads_them(tmp_path: Path, pg_url: str) -> None:
    """Against PostgreSQL the completion reads with psycopg alone: the same names in the same order as the
    engine's read; a URL this reader does not know, or an environment that may move the database, goes the full
    path; and the completer offers them through the shell protocol."""
    import os
    import subprocess
    import sys

    from aivedio_cli._fast_config import database_target, server_tenant_names

    target = database_target(None, [f"database.url={pg_url}"])
    assert target == pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    assert database_target(None, ["database.url=mysql://u@h/db"]) is None

    engine_names = _seed_tenants(tmp_path / "data", pg_url)
    assert isinstance(target, str)
    assert server_tenant_names(target) == engine_names and set(engine_names) >= {"zeta", "acme", "mid"}

    words = f"aivedio --set database.url={pg_url} ledger entries --tenant m"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AIVEDIO_")}
    env.update(_AIVEDIO_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(len(words.split(" ")) - 1))
    script = str(Path(sys.executable).with_name("aivedio"))
    done = subprocess.run(
        [sys.executable, "-X", "importtime", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["mid"]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time")}
    assert "psycopg" in imported and "sqlalchemy" not in imported and "pydantic" not in imported


def _seed_tenants(data_dir: Path, database_url: str | None = None) -> list[str]:
    """Three tenants created through the engine; their names as the engine itself lists them."""
    from aivedio_engine.db import tenants
    from tests.support.app import make_context

    ctx = make_context(data_dir, database_url)
    try:
        for name in ("zeta", "acme", "mid"):
            ctx.tenants.create(name, Decimal(10))
        with ctx.engine.connect() as conn:
            return [t.name for t in tenants.summaries(conn)]
    finally:
        ctx.close()
