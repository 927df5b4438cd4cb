"""Every row of the matrix, in the order `bench/run degrade` runs them: the six of `rows.py` (one dependency's
connection taken away each), then the two that take away a part of the deployment or slow the data plane."""

from __future__ import annotations

from bench.degrade import media_row, pressure_row
from bench.degrade.rows import ROWS as _PROXY_ROWS
from bench.degrade.rows import Row

ROWS: dict[str, Row] = {**_PROXY_ROWS, media_row.ROW.name: media_row.ROW, pressure_row.ROW.name: pressure_row.ROW}
