"""`bench/run degrade`: the degradation matrix (issue 14 item 7), one row per dependency."""
