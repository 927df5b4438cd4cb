"""Logs, metrics and alert rules: what an operator sees of a running engine.

- `redact`: masking secrets, signed URLs and prompts out of anything that is logged.
- `logging`: structlog over the standard library; trace/task/attempt ids from contextvars.
- `metrics`: Prometheus metrics; the database-derived ones are read at scrape time.
- `alert_rules`: thresholds over live data, written as deduplicated rows in `alerts`.
"""
