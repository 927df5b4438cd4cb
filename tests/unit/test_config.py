"""Configuration: precedence, the committed aivedio.toml, masking, and one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aivedio_cli.main import app
from aivedio_engine.config import ConfigError, Settings, load_settings, masked_dump
from aivedio_engine.domain.retry import DEFAULT_BUDGETS, Step

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    return path


def test_committed_toml_is_the_embedded_default_and_equals_the_code_defaults() -> None:
    from_file = load_settings(REPO / "aivedio.toml")
    assert from_file.model_dump() == Settings().model_dump()
    assert from_file.mode == "embedded"
    assert from_file.database_url.startswith("sqlite:///")
    assert from_file.broker.kind == "stub" and from_file.storage.kind == "fs"
    assert from_file.default_provider == "local" and from_file.providers["local"].adapter == "local"


def test_committed_toml_comments_every_section() -> None:
    lines = (REPO / "aivedio.toml").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("[") and not line.startswith("[providers.local.models"):
            # the line before a section header, or the one after, is a comment
            assert lines[i - 1].startswith("#") or lines[i + 1].startswith("#"), line


def test_precedence_cli_over_env_over_file_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _toml(tmp_path, "[api]\nport = 7001\nhost = '0.0.0.0'\n[database]\npool_size = 3\n")
    assert Settings().api.port == 8000
    assert load_settings(cfg).api.port == 7001
    monkeypatch.setenv("AIVEDIO_API__PORT", "7002")
    s = load_settings(cfg)
    assert s.api.port == 7002 and s.api.host == "0.0.0.0" and s.database.pool_size == 3
    s = load_settings(cfg, {"api": {"port": "7003"}})
    assert s.api.port == 7003 and s.api.host == "0.0.0.0"  # nested override keeps the file's siblings


def test_config_file_from_env_var_then_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().api.port == 8000  # the test cwd has no aivedio.toml
    Path("aivedio.toml").write_text("[api]\nport = 7100\n")
    assert load_settings().api.port == 7100
    monkeypatch.setenv("AIVEDIO_CONFIG", str(_toml(tmp_path, "[api]\nport = 7200\n")))
    assert load_settings().api.port == 7200
    assert load_settings(_toml(tmp_path / "..", "[api]\nport = 7300\n")).api.port == 7300


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[api]\nport = 'x'\n", "invalid setting api.port:"),
        ("[api]\nport = 70000\n", "invalid setting api.port:"),
        ("[api\n", "invalid TOML"),
        ("typo_key = 1\n", "invalid setting typo_key:"),
        ("[retry.submit]\nmax_attempts = 0\n", "invalid setting retry.submit.max_attempts:"),
        ("[retry.media]\nbase_delay_s = 60\nmax_delay_s = 10\n", "invalid setting retry.media"),
        ("mode = 'distributed'\n", "invalid setting database.url: distributed mode needs a PostgreSQL URL"),
        ("[media]\nrequired_profiles = 'proxy'\n", "invalid setting media.required_profiles:"),
        # the runtime builds only these three brokers, so the model accepts only these three
        ("[broker]\nkind = 'kafka'\n", "invalid setting broker.kind: Input should be 'stub', 'redis' or 'rabbitmq'"),
        ("[broker]\nkind = 'rabbitmq'\n", "broker.url must start with amqp:// or amqps:// when broker.kind = rabbitmq"),
        ("[retry.media]\nprovider_switch_allowed = true\n", "only [retry.submit] can move a task"),
        # with the lag at or past the park window a submit the vendor never got is always parked (a chaos run's
        # compressed schedule did that: park 40 s, lag 60 s, and the parked submits starved their tenant)
        ("[reconcile]\npark_after_s = 40\n", "reconcile.visibility_lag_s (60) must be below reconcile.park_after_s"),
    ],
)
def test_invalid_file_fails_with_one_line_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(_toml(tmp_path, text))
    assert needle in str(info.value) and "\n" not in str(info.value)
    result = runner.invoke(app, ["--config", str(tmp_path / "cfg.toml"), "config", "show"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ") and needle in result.stderr


def test_bad_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIVEDIO_DATABASE__POOL_SIZE", "lots")
    result = runner.invoke(app, ["config", "show"])
    assert result.exit_code == 2
    assert "database.pool_size" in result.stderr and "AIVEDIO_DATABASE__POOL_SIZE" in result.stderr


def test_missing_explicit_config_file_is_a_usage_error() -> None:
    result = runner.invoke(app, ["--config", "nope.toml", "config", "show"])
    assert result.exit_code == 2 and "config file not found: nope.toml" in result.stderr


def test_show_masks_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIVEDIO_PROVIDERS__LOCAL__API_KEY", "sk-very-secret")
    monkeypatch.setenv("AIVEDIO_STORAGE__SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("AIVEDIO_DATABASE__URL", "postgresql+psycopg://app:hunter2@db:5432/aivedio")
    result = runner.invoke(app, ["config", "show", "--json"])
    assert result.exit_code == 0, result.stderr
    for secret in ("sk-very-secret", "aws-secret-value", "hunter2"):
        assert secret not in result.stdout
    data = json.loads(result.stdout)
    assert data["providers"]["local"]["api_key"] == "**********"
    assert data["storage"]["secret_access_key"] == "**********"
    assert data["storage"]["signing_key"] == ""  # unset secrets stay visibly unset
    assert data["database"]["url"] == "postgresql+psycopg://app:**********@db:5432/aivedio"
    human = runner.invoke(app, ["config", "show"])
    assert human.exit_code == 0 and "hunter2" not in human.stdout and "sk-very-secret" not in human.stdout
    assert "api.port = 8000" in human.stdout


def test_set_option_overrides_and_rejects_garbage(tmp_path: Path) -> None:
    shutil.copy(REPO / "aivedio.toml", "aivedio.toml")
    result = runner.invoke(
        app, ["--set", "api.port=9100", "--set", "retry.submit.max_attempts=5", "config", "show", "--json"]
    )
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["api"]["port"] == 9100 and data["retry"]["submit"]["max_attempts"] == 5
    bad = runner.invoke(app, ["--set", "api.port", "config", "show"])
    assert bad.exit_code == 2 and "expected KEY=VALUE" in bad.stderr


def test_retry_budgets_have_defaults_and_are_configurable(tmp_path: Path) -> None:
    s = Settings()
    for step in Step:
        assert s.retry.budget(step) == DEFAULT_BUDGETS[step]
    submit = s.retry.budget(Step.SUBMIT)
    # 30 s, 2 min, 5 min; max_retry 3
    assert [submit.delay_cap(i) for i in range(3)] == [30, 120, 300] and submit.max_attempts == 3
    custom = load_settings(_toml(tmp_path, "[retry.query]\nmax_attempts = 7\nbase_delay_s = 2\n"))
    assert custom.retry.budget(Step.QUERY).max_attempts == 7
    assert custom.retry.budget(Step.QUERY).base_delay_s == 2
    assert custom.retry.budget(Step.QUERY).max_delay_s == DEFAULT_BUDGETS[Step.QUERY].max_delay_s


def test_masked_dump_is_json_serialisable() -> None:
    json.dumps(masked_dump(Settings()))


@pytest.mark.parametrize(
    ("kind", "url", "ok"),
    [
        ("rabbitmq", "amqp://guest:guest@127.0.0.1:5672/aivedio", True),
        ("rabbitmq", "redis://127.0.0.1:6379/0", False),
        ("redis", "redis://127.0.0.1:6379/0", True),
        ("redis", "amqp://guest:guest@127.0.0.1:5672/%2F", False),
        ("stub", "anything", True),
    ],
)
def test_broker_url_must_fit_its_kind(kind: str, url: str, ok: bool) -> None:
    overrides = {"broker": {"kind": kind, "url": url}}
    if ok:
        assert load_settings(overrides=overrides).broker.url == url
    else:
        with pytest.raises(ConfigError, match=f"broker.url must start with .* when broker.kind = {kind}"):
            load_settings(overrides=overrides)


def test_a_secret_can_come_from_a_file_named_by_a_file_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "provider_key"
    secret.write_text("secret-123\n")  # a secret mount's trailing newline is not part of the key
    monkeypatch.setenv("AIVEDIO_PROVIDERS__LOCAL__API_KEY_FILE", str(secret))
    monkeypatch.setenv("AIVEDIO_API_KEY_FILE", str(secret))  # the CLI client's own variable: not a setting
    settings = load_settings(REPO / "aivedio.toml", {"data_dir": str(tmp_path)})
    assert settings.providers["local"].api_key.get_secret_value() == "secret-123"
    assert settings.providers["local"].models  # the rest of the provider's section still comes from the file

    monkeypatch.setenv("AIVEDIO_PROVIDERS__LOCAL__API_KEY", "from-env")
    with pytest.raises(ConfigError, match="both AIVEDIO_PROVIDERS__LOCAL__API_KEY and .*_FILE are set"):
        load_settings(REPO / "aivedio.toml", {"data_dir": str(tmp_path)})
    monkeypatch.delenv("AIVEDIO_PROVIDERS__LOCAL__API_KEY")
    monkeypatch.setenv("AIVEDIO_PROVIDERS__LOCAL__API_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"AIVEDIO_PROVIDERS__LOCAL__API_KEY_FILE: cannot read .*missing"):
        load_settings(REPO / "aivedio.toml", {"data_dir": str(tmp_path)})
