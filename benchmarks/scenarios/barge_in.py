"""The user talking over the avatar: when does the barge-in VAD hear them start, with the residual-echo
mask as it is now and as it was (a -6 dB ratio, applied during double talk too), side by side in one run.

The avatar's Piper speech is heard at ×0.3 through delays of 40/120/250 ms, directly or through five
synthetic rooms; three espeak-ng interruptions start at 2 s at 0, -3 and -6 dB under the echo; and the
avatar is also retimed (×0.97–1.03, started 0–0.3 s in) so that other syllables lie under the user's first
words. A start heard more than 150 ms late counts as a miss; "gated" is what the server's VAD hears (silence
where the mask is set), "ungated" the canceller's output alone. The echo-only runs give the share of loud
echo the mask still takes and the VAD's false starts.

    .venv/bin/python -m benchmarks barge_in [--out FILE.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # after PYTHONPATH: a before/after run names its own lipstream there
sys.path.insert(0, str(REPO / "tests"))

from bench_common import cpu_model  # noqa: E402
from test_talk_echo import retimed  # noqa: E402

from benchmarks.scenarios.echo import (  # noqa: E402
    AVATAR_TEXT,
    CHUNK,
    FRAME,
    LEAD,
    SETTLED,
    SR,
    echo_of,
    room,
    speech_starts,
)
from lipstream.talk.hearing.echo import EchoCanceller  # noqa: E402
from lipstream.talk.hearing.vad import SileroModel  # noqa: E402
from lipstream.talk.voices.tts import create_tts  # noqa: E402

USER_TEXTS = (
    "Wait, stop, I have a question.",
    "Sorry, one more thing.",
    "Hold on, that is not what I asked.",
)
USER_AT = 2 * SR
LATE_S = 0.150


class PreviousMask(EchoCanceller):
    """The mask before this change: -6 dB, and set during double talk as well."""

    RESIDUAL_RATIO = 0.25

    def _residual_only(self, hi: int) -> bool:
        if not self._adapted:
            return False
        err, y = self._blk_err[:hi], self._blk_yf[:hi]
        return float(err @ err) < self.RESIDUAL_RATIO * float(y @ y)


def stream(kind: type[EchoCanceller], avatar: np.ndarray, mic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Feed the canceller like the server does; its output and residual-echo mask."""
    ec = kind()
    pcm16 = np.clip(np.round(avatar * 32767), -32768, 32767).astype(np.int16)
    sent = 0
    out = np.zeros(len(mic), dtype=np.float32)
    mask = np.zeros(len(mic), dtype=bool)
    for i in range(0, len(mic), CHUNK):
        while sent < min(len(pcm16), i + LEAD):
            ec.add_reference(sent, pcm16[sent : sent + FRAME])
            sent += FRAME
        piece = mic[i : i + CHUNK].astype(np.float32)
        out[i : i + len(piece)], mask[i : i + len(piece)] = ec.process_gated(piece, i + len(piece) - 1)
    return out, mask


def first_start(model: SileroModel, pcm: np.ndarray) -> float | None:
    """Seconds (from 0) of the first speech start after the settling time."""
    starts = speech_starts(model, pcm[SETTLED:], SETTLED)
    return starts[0] if starts else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/echo_double_talk_bench.json")
    args = parser.parse_args(argv)

    voice = create_tts("piper").synthesize(AVATAR_TEXT).pcm[: 6 * SR].astype(np.float64)
    espeak = create_tts("espeak")
    users = [espeak.synthesize(t).pcm.astype(np.float64) for t in USER_TEXTS]
    model = SileroModel()
    rules = {"before": PreviousMask, "after": EchoCanceller}
    cases = [
        (1.0, 0, delay, seed, level_db, u)
        for delay, seed, level_db, u in itertools.product(
            (40, 120, 250), (None, 1, 2, 3, 4, 5), (0, -3, -6), (0, 1, 2)
        )
    ] + [
        (rate, skip, 120, seed, 0, 0)
        for rate, skip, seed in itertools.product(
            (0.97, 0.99, 1.01, 1.03), (0, 1600, 3200, 4800), (None, 1, 2)
        )
    ]
    results: dict[str, dict[str, list]] = {name: {"gated": [], "ungated": []} for name in rules}
    misses: dict[str, list[dict]] = {name: [] for name in rules}
    for rate, skip, delay, seed, level_db, u in tqdm(cases, desc="double talk"):
        avatar = retimed(voice, rate, skip)
        echo = echo_of(avatar, delay, room(seed) if seed is not None else None, seed=0)
        end = min(len(echo), USER_AT + len(users[u]))
        words = np.zeros(len(echo))
        level = np.sqrt(np.mean(echo[USER_AT:end] ** 2) / np.mean(users[u][: end - USER_AT] ** 2))
        words[USER_AT:end] = users[u][: end - USER_AT] * level * 10 ** (level_db / 20)
        for name, kind in rules.items():
            out, mask = stream(kind, avatar, echo + words)
            for view, pcm in (("gated", np.where(mask, 0.0, out)), ("ungated", out)):
                start = first_start(model, pcm)
                late = None if start is None else round(start - USER_AT / SR, 3)
                results[name][view].append(late)
                if view == "gated" and (late is None or abs(late) > LATE_S):
                    misses[name].append(
                        {"rate": rate, "skip_s": skip / SR, "delay_ms": delay, "room": seed,
                         "user_db": level_db, "user": u, "heard_late_s": late}
                    )

    echo_only: dict[str, dict[str, float]] = {}
    for name, kind in rules.items():
        shares, false_starts = [], 0
        for delay, seed in itertools.product((40, 120, 250), (None, 1, 2, 3)):
            echo = echo_of(voice, delay, room(seed) if seed is not None else None, seed=delay)
            out, mask = stream(kind, voice, echo)
            tail = echo[SETTLED:]
            n = len(tail) // 320 * 320
            power = np.mean(tail[:n].reshape(-1, 320) ** 2, axis=1)
            loud = np.repeat(power >= power.max() / 100, 320)
            shares.append(float(mask[SETTLED : SETTLED + n][loud].mean()))
            false_starts += len(speech_starts(model, np.where(mask, 0.0, out)[SETTLED:]))
        echo_only[name] = {"loud_echo_masked_min": round(min(shares), 3),
                           "loud_echo_masked_mean": round(float(np.mean(shares)), 3),
                           "vad_false_starts_gated": false_starts}

    summary = {}
    for name in rules:
        row = {}
        for view in ("gated", "ungated"):
            late = results[name][view]
            heard = [abs(x) for x in late if x is not None]
            row[f"{view}_missed"] = sum(1 for x in late if x is None or abs(x) > LATE_S)
            row[f"{view}_median_ms"] = round(1000 * float(np.median(heard)), 1) if heard else None
        row["cases"] = len(cases)
        row.update(echo_only[name])
        summary[name] = row
        print(f"{name:6s}: gated misses {row['gated_missed']}/{len(cases)}, ungated {row['ungated_missed']}, "
              f"median {row['gated_median_ms']} ms; loud echo masked ≥ {row['loud_echo_masked_min']:.0%}, "
              f"false starts {row['vad_false_starts_gated']}")
    result = {"cpu": cpu_model(), "late_after_s": LATE_S, "summary": summary, "misses": misses}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
