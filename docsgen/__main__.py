"""`python -m docsgen` rewrites the generated parts of docs/; `--check` only reports stale ones (exit 1)."""

from __future__ import annotations

import sys

from docsgen import REFRESH, DocsError, stale, write


def main(argv: list[str]) -> int:
    try:
        if "--check" in argv:
            files = stale()
            for name in files:
                print(f"stale: {name} (run `{REFRESH}`)", file=sys.stderr)
            return 1 if files else 0
        for name in write():
            print(f"wrote {name}", file=sys.stderr)
    except DocsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
