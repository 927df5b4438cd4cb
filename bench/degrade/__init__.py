"""`bench/run degrade`: the degradation matrix (issue 14 item 7, seed 000 §4.11.2), one row per dependency."""
