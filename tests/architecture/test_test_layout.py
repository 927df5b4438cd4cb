"""Test files share helpers through tests/support/, never by importing another test file: a test module is run,
not imported, and a helper kept in one makes its importers depend on that file's fixtures and collection.
KNOWN lists the imports that are still to move; it may only shrink."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
IMPORT = re.compile(r"^\s*(?:from|import) (tests(?:\.\w+)*\.test_\w+)", re.M)

#: (importing file, imported test module) pairs not moved to tests/support yet
KNOWN = {
    ("api/test_sse_limits.py", "tests.api.test_events_sse"),
    ("api/test_upload_abuse.py", "tests.api.test_assets"),
    ("cli/test_replay_observations_cli.py", "tests.flow.test_keep_moving"),
    ("cli/test_runbooks.py", "tests.cli.test_ledger_cli"),
    ("cli/test_runbooks.py", "tests.cli.test_reconcile_cli"),
    ("cli/test_runbooks.py", "tests.cli.test_replay_cli"),
    ("cli/test_runbooks.py", "tests.flow.test_output_fetch"),
    ("cli/test_runbooks.py", "tests.flow.test_late_submit"),
    ("e2e/test_multi_output.py", "tests.e2e.test_reference_pixels"),
    ("e2e/test_photo_story_distributed.py", "tests.e2e.test_distributed"),
    ("e2e/test_resume.py", "tests.e2e.test_interrupt"),
    ("flow/test_inline_media.py", "tests.flow.test_output_fetch"),
    ("flow/test_vendor_bill.py", "tests.cli.test_ledger_cli"),
    ("flow/test_media_interrupted.py", "tests.flow.test_media_pipeline"),
    ("flow/test_media_interrupted.py", "tests.flow.test_output_fetch"),
    ("flow/test_media_pipeline.py", "tests.flow.test_output_fetch"),
    ("integration/test_migrate.py", "tests.integration.test_schema"),
    ("integration/test_retention.py", "tests.integration.test_storage_scan"),
    ("integration/test_retention.py", "tests.integration.test_tenant_purge"),
    ("integration/test_storage_gc.py", "tests.integration.test_storage_scan"),
    ("integration/test_storage_scan.py", "tests.integration.test_observability"),
    ("integration/test_tenant_purge.py", "tests.integration.test_storage_scan"),
    ("integration/test_upload_quarantine.py", "tests.integration.test_storage_scan"),
    ("media/test_decoding_children_isolated.py", "tests.media.test_local_provider"),
    ("media/test_local_multi_output.py", "tests.media.test_local_provider"),
    ("media/test_local_provider_durable.py", "tests.media.test_local_provider"),
    ("media/test_local_provider_restart.py", "tests.media.test_local_provider"),
    ("tui/test_repair.py", "tests.flow.test_keep_moving"),
}


def _imports() -> set[tuple[str, str]]:
    found = set()
    for path in TESTS.rglob("*.py"):
        for module in IMPORT.findall(path.read_text(encoding="utf-8")):
            found.add((path.relative_to(TESTS).as_posix(), module))
    return found


def test_no_test_file_imports_another_beyond_the_known_ones() -> None:
    new = sorted(_imports() - KNOWN)
    assert not new, f"move the shared helpers to tests/support/ instead of importing test files: {new}"


def test_the_known_list_only_shrinks() -> None:
    moved = sorted(KNOWN - _imports())
    assert not moved, f"these imports are gone: take them off KNOWN: {moved}"
