"""aivedio's Textual front end (reviewer and operator screens). Imported only by `aivedio tui`."""
