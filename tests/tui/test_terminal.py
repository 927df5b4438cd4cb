"""`aivedio tui` in a real terminal (tmux): the CLI's global options reach the dashboard, it draws, switches
screens on a digit and quits cleanly on `q`. Everything else is tested headless with Pilot."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.app import make_context, tenant_with_key
from tests.support.sim import wait_until

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


@pytest.fixture
def tmux() -> Iterator[list[str]]:
    socket = f"aivedio-test-{uuid.uuid4().hex[:8]}"  # a server of its own: never touches a developer's sessions
    yield ["tmux", "-L", socket]
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False)


def test_the_dashboard_runs_in_a_terminal_and_quits(tmp_path: Path, tmux: list[str]) -> None:
    ctx = make_context(tmp_path / "data")
    tenant_with_key(ctx, "acme", 50)
    ctx.close()
    exit_file = tmp_path / "exit"
    command = (
        f"{sys.executable} -m aivedio_cli --set data_dir={tmp_path / 'data'} tui --readonly; echo $? > {exit_file}"
    )
    subprocess.run([*tmux, "new-session", "-d", "-s", "tui", "-x", "140", "-y", "40", command], check=True)

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-t", "tui", "-p"], capture_output=True, text=True, check=False
        ).stdout

    wait_until(lambda: "Key figures" in screen(), timeout_s=20, what="the overview")
    assert "READ-ONLY" in screen()
    subprocess.run([*tmux, "send-keys", "-t", "tui", "6"], check=True)
    wait_until(lambda: "acme" in screen() and "Balances" in screen(), timeout_s=20, what="the ledger")
    subprocess.run([*tmux, "send-keys", "-t", "tui", "q"], check=True)
    wait_until(exit_file.exists, timeout_s=20, what="the dashboard to exit")
    wait_until(lambda: exit_file.read_text().strip() != "", timeout_s=5, what="the exit status")
    assert exit_file.read_text().strip() == "0"
