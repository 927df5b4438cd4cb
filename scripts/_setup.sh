# Sourced by scripts/quickstart and scripts/test: a project virtualenv with aivedio installed.
# Idempotent: a second run only checks that everything is in place.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
EXTRAS="${1:-}"

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
stamp="$VENV/.aivedio-installed${EXTRAS:+-$EXTRAS}"
# Exact versions with their hashes from the lock (requirements/test.txt for "test", else base.txt; `bash
# scripts/lock` refreshes them), so a fresh clone installs what was tested. With hashes pip must check every
# requirement, so the project itself goes in afterwards without its dependencies, built by the locked setuptools.
lock="$ROOT/requirements/${EXTRAS:-base}.txt"
if [ ! -f "$stamp" ] || [ "$ROOT/pyproject.toml" -nt "$stamp" ] || [ "$lock" -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --require-hashes -r "$lock"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT"
  if ! "$VENV/bin/python" -m pip check >/dev/null; then
    "$VENV/bin/python" -m pip check >&2 || true
    echo "error: $lock does not satisfy pyproject.toml: refresh it with \`bash scripts/lock\`" >&2
    exit 1
  fi
  touch "$stamp"
fi

# ffmpeg/ffprobe render and check media; install them from Debian's packages when missing.
if ! command -v ffmpeg >/dev/null 2>&1 || ! command -v ffprobe >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ffmpeg with apt-get..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null
  else
    echo "warning: ffmpeg not found and cannot be installed here (need root and apt-get)" >&2
  fi
fi

# The photo_story workflow speaks its script with ffmpeg's flite filter; an ffmpeg built without libflite needs
# espeak-ng instead (Debian's package).
if command -v ffmpeg >/dev/null 2>&1 && ! ffmpeg -hide_banner -filters 2>/dev/null | grep -qw flite \
  && ! command -v espeak-ng >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing espeak-ng with apt-get (this ffmpeg has no flite)..." >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends espeak-ng >/dev/null
  else
    echo "warning: no TTS for the photo_story example: ffmpeg lacks flite and espeak-ng is missing" >&2
  fi
fi
