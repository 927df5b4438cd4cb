"""Save provider-event streams of a chaos run as replay fixtures (tests/fixtures/replay/*.json).

One fixture per task: the observations of its one attempt, in the order the live reducer took them (the order
of their task_state_events rows), each with the outcome the live reducer recorded, and the states it applied.
tests/unit/test_replay_fixtures.py feeds them through the reducer again and asserts the same states.
Tasks with one attempt, no cancel and at least `min_events` observations are taken, the most eventful first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos.cluster import Cluster


def export(cluster: Cluster, out_dir: Path, limit: int = 4, min_events: int = 3) -> list[Path]:
    with psycopg.connect(cluster.dsn) as conn:
        candidates = conn.execute(
            """
            SELECT t.id::text, a.id, t.status, count(e.id) AS n,
                   count(DISTINCT e.observation->>'status') AS kinds
            FROM generation_tasks t
            JOIN task_attempts a ON a.task_id = t.id
            JOIN provider_events e ON e.matched_attempt_id = a.id
            WHERE t.cancel_requested_at IS NULL
              AND (SELECT count(*) FROM task_attempts b WHERE b.task_id = t.id) = 1
            GROUP BY t.id, a.id, t.status
            HAVING count(e.id) >= %s
            ORDER BY count(DISTINCT e.observation->>'status') DESC, count(e.id) DESC, t.id
            LIMIT %s
            """,
            (min_events, limit),
        ).fetchall()
        written = []
        for task_id, attempt_id, status, _, _ in candidates:
            rows = conn.execute(
                """
                SELECT e.observation, s.outcome, s.to_status
                FROM provider_events e
                JOIN task_state_events s ON s.source = e.source AND s.source_event_id = e.dedup_key
                WHERE e.matched_attempt_id = %s
                ORDER BY s.created_at, s.id
                """,
                (attempt_id,),
            ).fetchall()
            steps: list[dict[str, Any]] = [
                {"observation": obs, "live_outcome": outcome, "live_to_status": to_status}
                for obs, outcome, to_status in rows
            ]
            if len(steps) < min_events:
                continue
            doc = {
                "about": "provider events of one task recorded by `bench/run chaos`; replayed by "
                "tests/unit/test_replay_fixtures.py",
                "seed": cluster.seed,
                "task_final_status": status,
                "live_applied": [s["live_to_status"] for s in steps if s["live_outcome"] == "applied"],
                "steps": steps,
            }
            path = out_dir / f"chaos-s{cluster.seed}-{task_id[-12:]}.json"
            path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
            written.append(path)
    return written
