"""Listen to a photo_story video: transcribe its narration offline and compare the words with the script's.

    python check_narration.py story.mp4 script.txt [--min-overlap 0.75] [--json]

The audio track is extracted with ffmpeg as 16 kHz mono WAV (what the recogniser's English model expects) and
transcribed by PocketSphinx (`pip install pocketsphinx`: the package ships its US English model, so nothing is
downloaded at run time). The word overlap is the share of the script's words heard, in order. A synthetic voice
over a music bed is not studio speech: expect most words, not all of them. Exit 0 when the overlap reaches
`--min-overlap`, 1 below it, 2 on bad input (a missing file, no audio track, ffmpeg or PocketSphinx missing).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

RATE = 16_000


def extract_audio(video: Path, wav: Path) -> None:
    """The first audio track as 16 kHz mono 16-bit WAV."""
    argv = ["ffmpeg", "-v", "error", "-nostdin", "-y", "-i", str(video), "-map", "0:a:0", "-ac", "1", "-ar"]
    proc = subprocess.run([*argv, str(RATE), "-c:a", "pcm_s16le", str(wav)], capture_output=True, timeout=120)
    if proc.returncode != 0:
        raise ValueError(f"{video}: no audio extracted: {proc.stderr.decode(errors='replace').strip()[-300:]}")


def transcribe(wav: Path) -> str:
    from pocketsphinx import Decoder

    with wave.open(str(wav)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
            raise ValueError(f"{wav}: expected 16 kHz mono 16-bit audio")
        pcm = w.readframes(w.getnframes())
    decoder = Decoder(samprate=RATE, loglevel="FATAL")
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def word_overlap(script: str, heard: str) -> tuple[float, list[str]]:
    """(share of the script's words heard in order, the words not heard). Two script words written as one in
    the recogniser's dictionary ("good bye" → "goodbye") count as heard when that one word was heard."""
    said, got = words(script), words(heard)
    heard_set, merged, i = set(got), [], 0
    while i < len(said):
        if i + 1 < len(said) and said[i] + said[i + 1] in heard_set and said[i] not in heard_set:
            merged.append((said[i] + said[i + 1], 2))
            i += 2
        else:
            merged.append((said[i], 1))
            i += 1
    matcher = difflib.SequenceMatcher(a=[w for w, _ in merged], b=got, autojunk=False)
    hit = [False] * len(merged)
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            hit[block.a + k] = True
    total = sum(n for _, n in merged)
    found = sum(n for (_, n), h in zip(merged, hit, strict=True) if h)
    missing = [w for (w, _), h in zip(merged, hit, strict=True) if not h]
    return (found / total if total else 0.0), missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("video", type=Path)
    parser.add_argument("script", type=Path, help="the script file the project was made from")
    parser.add_argument("--min-overlap", type=float, default=0.75)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        script = args.script.read_text(encoding="utf-8")
        if not args.video.is_file():
            raise ValueError(f"{args.video}: no such file")
        with tempfile.TemporaryDirectory() as tmp:
            wav = Path(tmp) / "narration.wav"
            extract_audio(args.video, wav)
            heard = transcribe(wav)
    except (OSError, ValueError, ImportError) as exc:
        print(f"check_narration: {exc}", file=sys.stderr)
        return 2
    overlap, missing = word_overlap(script, heard)
    if args.json:
        print(json.dumps({"heard": heard, "overlap": round(overlap, 3), "missing": missing}))
    else:
        print(f"heard:   {heard}")
        print(
            f"overlap: {overlap:.0%} of the script's words" + (f" (not heard: {' '.join(missing)})" if missing else "")
        )
    return 0 if overlap >= args.min_overlap else 1


if __name__ == "__main__":
    sys.exit(main())
