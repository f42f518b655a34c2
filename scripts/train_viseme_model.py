"""Train the viseme engine's audio -> articulation MLP on speech synthesised here, and ship it as .npz.

Labels come from the TTS voices' own phoneme timings (lipstream.engines.viseme.articulation), so no
hand labelling is needed. Training speech: seven espeak-ng voices and the bundled Piper voice at three
speaking rates (length_scale 0.8, 0.95, 1.25). Held out for the test: other sentences, spoken by Piper at
a rate it never trained on (length_scale 1.1) and by an espeak-ng voice it never heard (en-gb-scotland).

    OMP_NUM_THREADS=1 .venv/bin/python scripts/train_viseme_model.py            # ~10 min on 2 cores
    OMP_NUM_THREADS=1 .venv/bin/python scripts/train_viseme_model.py --quick    # smoke run

Writes lipstream/engines/data/viseme_mlp.npz and prints/returns accuracy on the held-out voice.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pocketsphinx
import torch
from rich.progress import track

from lipstream.engines.base import Speech
from lipstream.engines.viseme.acoustic import AcousticConfig, AcousticFrontEnd
from lipstream.engines.viseme.articulation import CLOSURE, LABIODENTAL, OPEN, WIDTH, frames_from_phonemes
from lipstream.engines.viseme.model import DEFAULT_MODEL_PATH, ArticulationModel
from lipstream.talk.voices.espeak_tts import EspeakTTS
from lipstream.talk.voices.piper_tts import PiperTTS

TRAIN_VOICES = ("en-us", "en-us+m3", "en-us+f2", "en-us+f4", "en-gb-x-rp", "en-us+klatt2", "en+m7")
PIPER_TRAIN_SCALES = (0.8, 0.95, 1.25)  # Piper length_scale (speaking rate) of the training speech
PIPER_TEST_SCALE = 1.1
ESPEAK_TEST_VOICE = "en-gb-scotland"
BEFORE, AFTER = 3, 3  # acoustic context in frames; AFTER sets the engine's look-ahead


@dataclass
class Corpus:
    """Stacked acoustic windows, labels and the utterance each row came from."""

    x: np.ndarray
    y: np.ndarray
    utt: np.ndarray


def word_list(seed: int) -> list[str]:
    """Plain alphabetic words from the CMU dictionary shipped with pocketsphinx."""
    path = Path(pocketsphinx.get_model_path()) / "en-us" / "cmudict-en-us.dict"
    words = []
    for line in path.read_text(encoding="utf-8", errors="ignore").splitlines():
        w = line.split(" ", 1)[0]
        if w.isalpha() and w.islower() and 2 <= len(w) <= 9:
            words.append(w)
    rng = np.random.default_rng(seed)
    rng.shuffle(words)
    return words[:6000]


def sentences(n: int, seed: int, words: list[str]) -> list[str]:
    """Random word sequences with commas and full stops (pauses), deterministic for a seed."""
    rng = np.random.default_rng(seed)
    common = "the a and of to in is it you that he was for on are with as i his they be at".split()
    out = []
    for _ in range(n):
        parts = []
        for _clause in range(int(rng.integers(1, 3))):
            k = int(rng.integers(4, 9))
            clause = [
                common[int(rng.integers(len(common)))]
                if rng.random() < 0.35
                else words[int(rng.integers(len(words)))]
                for _ in range(k)
            ]
            parts.append(" ".join(clause))
        out.append(", ".join(parts).capitalize() + rng.choice([".", "?", "!", "."]))
    return out


def featurize(speech: Speech, front: AcousticFrontEnd, rng: np.random.Generator, augment: bool) -> tuple:
    """Acoustic rows (with context) and labels for one utterance."""
    pcm = speech.pcm
    if augment:
        pcm = pcm * np.float32(10 ** (rng.uniform(-14, 6) / 20))
        if rng.random() < 0.4:  # room tone / hiss at -70..-50 dBFS
            pcm = pcm + rng.normal(0, 10 ** (rng.uniform(-70, -50) / 20), pcm.size).astype(np.float32)
    n = speech.frame_count
    acoustic = front.frames(pcm, -BEFORE, n + BEFORE + AFTER)
    labels = frames_from_phonemes(speech.phonemes, n)
    win = np.lib.stride_tricks.sliding_window_view(acoustic, BEFORE + 1 + AFTER, axis=0)
    return win.transpose(0, 2, 1).reshape(n, -1).astype(np.float32), labels


def build(
    tts_list: list, texts: list[str], front: AcousticFrontEnd, seed: int, augment: bool, label: str
) -> Corpus:
    """Synthesise every text with every voice and stack the rows."""
    rng = np.random.default_rng(seed)
    xs, ys, us = [], [], []
    jobs = [(tts, t) for t in texts for tts in tts_list]
    for i, (tts, text) in enumerate(track(jobs, description=f"synthesising {label}")):
        speech = tts.synthesize(text)
        x, y = featurize(speech, front, rng, augment)
        xs.append(x)
        ys.append(y)
        us.append(np.full(len(y), i))
    return Corpus(np.concatenate(xs), np.concatenate(ys), np.concatenate(us))


def fit(train: Corpus, epochs: int, hidden: int, seed: int, labiodental: bool = False) -> ArticulationModel:
    """Train a 2-hidden-layer tanh MLP with Adam on MSE (open, width) + BCE (closure[, f/v])."""
    torch.manual_seed(seed)
    mean = train.x.mean(axis=0)
    std = train.x.std(axis=0) + 1e-3
    x = torch.from_numpy((train.x - mean) / std)
    y = torch.from_numpy(train.y)
    net = torch.nn.Sequential(
        torch.nn.Linear(x.shape[1], hidden),
        torch.nn.Tanh(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.Tanh(),
        torch.nn.Linear(hidden, 4 if labiodental else 3),
    )
    opt = torch.optim.Adam(net.parameters(), lr=2e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    gen = torch.Generator().manual_seed(seed)
    for _ in track(range(epochs), description="training"):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), 256):
            idx = perm[i : i + 256]
            z = net(x[idx])
            t = y[idx]
            loss = (
                torch.nn.functional.mse_loss(torch.sigmoid(z[:, OPEN]), t[:, OPEN]) * 4
                + torch.nn.functional.mse_loss(torch.tanh(z[:, WIDTH]), t[:, WIDTH])
                + torch.nn.functional.binary_cross_entropy_with_logits(z[:, CLOSURE], t[:, CLOSURE]) * 0.5
            )
            if labiodental:
                loss = loss + torch.nn.functional.binary_cross_entropy_with_logits(
                    z[:, LABIODENTAL], t[:, LABIODENTAL]
                ) * 0.5
            opt.zero_grad()
            loss.backward()
            opt.step()
        sched.step()
    layers = [m for m in net if isinstance(m, torch.nn.Linear)]
    return ArticulationModel(
        before=BEFORE,
        after=AFTER,
        mean=mean.astype(np.float32),
        std=std.astype(np.float32),
        weights=tuple(m.weight.detach().numpy().T.copy() for m in layers),
        biases=tuple(m.bias.detach().numpy().copy() for m in layers),
        acoustic=AcousticConfig(),
    )


def evaluate(model: ArticulationModel, corpus: Corpus) -> dict:
    """Per-frame accuracy against the timing-derived labels."""
    n = len(corpus.y)
    ctx = model.context
    d = corpus.x.shape[1] // ctx
    # Rows already hold their window; predict() wants consecutive rows, so feed each row as its own window.
    rows = corpus.x.reshape(n, ctx, d)
    pred = np.concatenate([model.predict(rows[i]) for i in range(n)])
    y = corpus.y
    precision, recall, f1 = _detection(y[:, CLOSURE] > 0.5, pred[:, CLOSURE] > 0.5)
    extra = {}
    if pred.shape[1] > LABIODENTAL:
        fv_true = y[:, LABIODENTAL] > 0.5
        p_fv, r_fv, f_fv = _detection(fv_true, pred[:, LABIODENTAL] > 0.5)
        extra = {
            "labiodental_frames": int(fv_true.sum()),
            "labiodental_precision": p_fv,
            "labiodental_recall": r_fv,
            "labiodental_f1": f_fv,
        }
    return {
        "frames": int(n),
        "open_pearson": float(np.corrcoef(pred[:, OPEN], y[:, OPEN])[0, 1]),
        "open_mae": float(np.mean(np.abs(pred[:, OPEN] - y[:, OPEN]))),
        "width_pearson": float(np.corrcoef(pred[:, WIDTH], y[:, WIDTH])[0, 1]),
        "closure_precision": precision,
        "closure_recall": recall,
        "closure_f1": f1,
        **extra,
    }


def _detection(truth: np.ndarray, predicted: np.ndarray) -> tuple[float, float, float]:
    """Precision, recall and F1 of a per-frame detector."""
    tp = float(np.sum(truth & predicted))
    precision = tp / max(float(predicted.sum()), 1.0)
    recall = tp / max(float(truth.sum()), 1.0)
    return precision, recall, 2 * precision * recall / max(precision + recall, 1e-9)


def main() -> None:
    """Synthesise, train, evaluate on the held-out voice, write the .npz and a JSON summary."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=220, help="espeak-ng training sentences (7 voices each)")
    ap.add_argument("--piper-sentences", type=int, default=150, help="Piper training sentences (3 rates)")
    ap.add_argument("--test-sentences", type=int, default=40, help="held-out sentences (held-out voices)")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="tiny run to check the script works")
    ap.add_argument(
        "--labiodental", action="store_true", help="a fourth output: the f/v cue"
    )
    ap.add_argument("-o", "--output", type=Path, default=DEFAULT_MODEL_PATH)
    ap.add_argument("--report", type=Path, default=Path("benchmarks/results/viseme_model_train.json"))
    args = ap.parse_args()
    if args.quick:
        args.sentences, args.piper_sentences, args.test_sentences, args.epochs = 10, 4, 4, 2
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    words = word_list(args.seed)
    front = AcousticFrontEnd(AcousticConfig())
    train_texts = sentences(args.sentences, args.seed, words)
    piper_texts = sentences(args.piper_sentences, args.seed + 500, words)
    test_texts = sentences(args.test_sentences, args.seed + 1000, words)
    voices = [EspeakTTS(v) for v in TRAIN_VOICES]
    espeak_train = build(voices, train_texts, front, args.seed, augment=True, label="espeak-ng (train)")
    pipers = [PiperTTS(length_scale=s) for s in PIPER_TRAIN_SCALES]
    piper_train = build(pipers, piper_texts, front, args.seed + 3, augment=True, label="piper (train)")
    train = Corpus(
        np.concatenate([espeak_train.x, piper_train.x]),
        np.concatenate([espeak_train.y, piper_train.y]),
        np.concatenate([espeak_train.utt, piper_train.utt + espeak_train.utt.max() + 1]),
    )
    test_espeak = build(
        [EspeakTTS(ESPEAK_TEST_VOICE)], test_texts, front, args.seed + 1, False, "espeak-ng (held-out voice)"
    )
    held_out_piper = [PiperTTS(length_scale=PIPER_TEST_SCALE)]
    test_piper = build(held_out_piper, test_texts, front, args.seed + 2, False, "piper (held-out rate)")
    model = fit(train, args.epochs, args.hidden, args.seed, args.labiodental)
    summary = {
        "train_frames": int(len(train.y)),
        "train_voices": [*TRAIN_VOICES, *(f"piper@{s}" for s in PIPER_TRAIN_SCALES)],
        "test_voices": [ESPEAK_TEST_VOICE, f"piper@{PIPER_TEST_SCALE}"],
        "epochs": args.epochs,
        "hidden": args.hidden,
        "outputs": model.outputs,
        "espeak_heldout_voice_and_text": evaluate(model, test_espeak),
        "piper_heldout_rate_and_text": evaluate(model, test_piper),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    model.save(args.output, **{k: v for k, v in summary.items() if k != "seconds"})
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.output} ({args.output.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
