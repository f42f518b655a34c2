"""Waveform and spectrogram around the first-phrase cut (issue 48), beside the same sentence spoken whole.

A voice that speaks in pieces (Piper cut in stages) has no cut in its text: the red line is then the join of
its first piece and the next, on the same clock as the whole sentence, and the title gives the largest
difference between the two waveforms around it.

    .venv/bin/python -m benchmarks phrase_seam [--voice piper|espeak] [--text "..."]

Writes benchmarks/results/phrase_seam_<voice>.png (and .wav of the cut version, to listen to): top, the
sentence spoken whole; bottom, its first phrase and the rest synthesised apart and joined as `speak` does.
The red line marks the cut, and the numbers in the titles are the silence at the join.
"""

from __future__ import annotations

import argparse
import asyncio
import wave
from pathlib import Path

import numpy as np

from lipstream.talk.voices import phrase_seam
from lipstream.talk.voices.piper_pieces import SEAM_FRAMES
from lipstream.talk.voices.speaker import Speaker
from lipstream.talk.voices.tts import PiperTTS, create_tts, in_pieces

REPO = Path(__file__).resolve().parents[2]
TEXT = "The museum on the hill will open late on Fridays this summer with live music in the garden."


async def _speeches(speaker: Speaker, text: str) -> list:
    return [speech async for speech in await speaker.speak(text, quick_start=True)]


def main(argv: list[str] | None = None) -> int:
    """Synthesise, plot, write the PNG and WAV."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voice", default="piper", choices=["piper", "espeak"])
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--window-ms", type=int, default=600, help="shown on each side of the cut")
    args = parser.parse_args(argv)
    voice = create_tts(args.voice, fallback=False, threads=1)
    speeches = asyncio.run(_speeches(Speaker(voices=lambda _name: voice), args.text))
    cut_pcm = np.concatenate([s.pcm for s in speeches])
    cut = len(speeches[0].pcm)
    whole = voice.synthesize(args.text).pcm
    # where the first phrase ends in the whole sentence: its phrase's duration, spoken alone, minus the seam
    whole_cut = min(len(whole) - 1, cut - phrase_seam.KEEP_BEFORE_CUT_MS * 16)
    half = args.window_ms * 16
    joined_label = f"cut: {speeches[0].text!r} | rest"
    head = voice.head_samples(args.text) if isinstance(voice, PiperTTS) else None  # None: not in pieces
    if head is not None:
        # a long sentence's head (its first words' own text side) and the rest, cross-faded at the cut
        cut = whole_cut = head  # the whole sentence's cut is within a few frames of the head's
        joined_label = f"head | rest, cross-faded over {SEAM_FRAMES} frames (~23 ms)"
    elif in_pieces(voice):
        whole_cut = cut  # the pieces are the whole sentence's samples, on its clock
        lo, hi = max(0, cut - half), min(len(whole), cut + half)
        scale = float(np.dot(cut_pcm, whole) / np.dot(cut_pcm, cut_pcm))
        differs = float(np.abs(cut_pcm[lo:hi] * scale - whole[lo:hi]).max())
        joined_label = (
            f"in pieces: {speeches[0].text!r} | next piece; largest difference from whole {differs:.4f}"
        )
    fig, axes = plt.subplots(4, 1, figsize=(12, 10), sharex=False)
    for row, (pcm, at, label) in enumerate(
        ((whole, whole_cut, "spoken whole"), (cut_pcm, cut, joined_label))
    ):
        lo, hi = max(0, at - half), min(len(pcm), at + half)
        t = (np.arange(lo, hi) - at) / 16.0
        wave_ax, spec_ax = axes[2 * row], axes[2 * row + 1]
        wave_ax.plot(t, pcm[lo:hi], lw=0.5)
        wave_ax.axvline(0, color="r", lw=0.8)
        wave_ax.set_ylim(-1, 1)
        wave_ax.set_title(f"{args.voice}: {label}", fontsize=9)
        spec_ax.specgram(pcm[lo:hi], NFFT=512, Fs=16000, noverlap=448, xextent=(t[0], t[-1]), cmap="magma")
        spec_ax.axvline(0, color="c", lw=0.8)
        spec_ax.set_ylabel("Hz")
    axes[-1].set_xlabel("ms from the cut (whole: about where the first phrase ends)")
    fig.tight_layout()
    out = REPO / "benchmarks" / "results" / f"phrase_seam_{args.voice}.png"
    fig.savefig(out, dpi=90)
    with wave.open(str(out.with_suffix(".wav")), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes((np.clip(cut_pcm, -1, 1) * 32767).astype("<i2").tobytes())
    print(f"wrote {out} and {out.with_suffix('.wav')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
