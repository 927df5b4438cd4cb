"""An output URL of the `local` provider made by an earlier process names that process's loopback port, which the
fetch policy (built from this process's port) refuses. The fetcher must then ask for a fresh URL instead of
failing the task for good; a configured vendor origin never moves, and its refusals stand without a query."""

from __future__ import annotations

from pathlib import Path

from tests.support.app import make_context


def test_only_a_url_of_the_local_providers_own_host_on_another_port_counts_as_moved(tmp_path: Path) -> None:
    ctx = make_context(tmp_path / "data")
    try:
        base = ctx.providers["local"].base_url  # type: ignore[attr-defined]
        port = int(base.rsplit(":", 1)[1])
        moved = ctx.output_fetch._origin_moved
        assert moved("local", f"http://127.0.0.1:{port + 1 if port < 65535 else 1024}/outputs/loc_x.mp4?sig=s")
        assert not moved("local", f"{base}/outputs/loc_x.mp4?sig=s")  # its own origin: a real refusal
        assert not moved("local", f"http://127.0.0.1:{port}@evil.example/outputs/x.mp4")
        assert not moved("local", "http://10.0.0.1:8080/outputs/loc_x.mp4")
        assert not moved("local", "https://evil.example/outputs/loc_x.mp4")
    finally:
        ctx.close()
