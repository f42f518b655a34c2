"""MuseTalk on this CPU: full-size random weights, fp32 vs bf16, batch 1/4/8 vs a naive path, side by side.

    OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks musetalk_on_cpu
writes benchmarks/results/musetalk_cpu.json and musetalk_cpu.png. --tiny runs the CI widths in seconds.
Naive = fp32, batch 1, no warm-up, the time MLP run per call, features recomputed for every frame.
Ours  = fixed batch after a warm-up, t=0 embedding precomputed, features once per utterance.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from rich.progress import Progress  # noqa: E402

from lipstream.engines.musetalk.features import WINDOW_STEPS, WhisperFeaturizer  # noqa: E402
from lipstream.engines.musetalk.generator import MuseTalkGenerator, positional_encoding, unfreeze_time  # noqa: E402
from lipstream.engines.musetalk.loader import Runtime  # noqa: E402
from lipstream.engines.musetalk.topology import random_models  # noqa: E402

UTTERANCE_S = 10.0  # features are amortised over a 10 s utterance (250 frames)


def ms(fn) -> float:
    """Wall milliseconds of one call."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def naive_frames(unet, vae, featurizer, pcm: np.ndarray, n: int) -> list[float]:
    """ms per frame of the naive path: everything per frame, fp32, batch 1, cold start included."""
    tokens, dim = WINDOW_STEPS * featurizer.n_states, featurizer.dim
    pe = positional_encoding(tokens, dim)
    latents = torch.randn(1, 8, 32, 32)
    unfreeze_time(unet)
    out = []
    for f in range(n):
        t0 = time.perf_counter()
        feats = featurizer.features(pcm)[f]  # the whole utterance again, for one frame
        with torch.inference_mode():
            audio = torch.from_numpy(feats).reshape(1, tokens, dim) + pe
            pred = unet(latents, torch.tensor([0]), encoder_hidden_states=audio).sample
            image = vae.decode(pred / vae.config.scaling_factor).sample
        patch = ((image[0].permute(1, 2, 0).numpy() / 2 + 0.5).clip(0, 1) * 255).round().astype(np.uint8)
        assert patch.shape == (256, 256, 3)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure, print a table, write JSON and a PNG."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--batches", default="1,4,8")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--naive-frames", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=400.0, help="skip configurations past this time")
    ap.add_argument("--out", default="benchmarks/results/musetalk_cpu.json")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    unet, vae, encoder, extractor = random_models(tiny=args.tiny, device="cpu")
    featurizer = WhisperFeaturizer(encoder, extractor)
    tokens = WINDOW_STEPS * featurizer.n_states
    pcm = np.random.default_rng(0).normal(0, 0.1, int(UTTERANCE_S * 16_000)).astype(np.float32)
    n_frames = int(UTTERANCE_S * 25)
    build_s = time.perf_counter() - start

    naive = naive_frames(unet, vae, featurizer, pcm, args.naive_frames)  # first: nothing is warm yet
    featurizer.features(pcm)
    whisper_ms = ms(lambda: featurizer.features(pcm)) / n_frames
    time_mlp = {}
    rows, skipped = [], []
    # interleaved (fp32 b1, bf16 b1, fp32 b4, ...) so a run cut by the budget still compares both dtypes;
    # the weights are cast in place each time (random weights: bf16 rounding does not change the timing)
    configs = [(d, b) for b in batches for d in args.dtypes.split(",")]
    with Progress(transient=True) as bar:
        task = bar.add_task("configurations", total=len(configs))
        for dname, b in configs:
            if time.perf_counter() - start > args.budget_s:
                skipped.append(f"{dname}@{b}")
                bar.advance(task)
                continue
            unet.to(dtype=dtypes[dname])
            vae.to(dtype=dtypes[dname])
            rt = Runtime(torch.device("cpu"), dtypes[dname])
            t0 = time.perf_counter()
            gen = MuseTalkGenerator(unet, vae, rt, tokens, batch_size=b)  # includes the warm-up batch
            warm_s = time.perf_counter() - t0
            latents = torch.randn((b, *gen.latent_shape), dtype=rt.dtype)
            audio = torch.randn((b, tokens, featurizer.dim), dtype=rt.dtype)
            pred = gen.predict(latents, audio)
            unet_ms = ms(lambda: gen.predict(latents, audio))  # noqa: B023 - used right away
            vae_ms = ms(lambda: gen.decode(pred))  # noqa: B023
            frame_ms = (unet_ms + vae_ms) / b + whisper_ms
            rows.append(
                {
                    "dtype": dname,
                    "batch": b,
                    "unet_ms_per_frame": round(unet_ms / b, 1),
                    "vae_decode_ms_per_frame": round(vae_ms / b, 1),
                    "whisper_ms_per_frame": round(whisper_ms, 2),
                    "frame_ms": round(frame_ms, 1),
                    "frames_per_s": round(1000 / frame_ms, 3),
                    "warmup_s": round(warm_s, 1),
                }
            )
            if b == batches[0] and dname == "fp32":  # the precomputed t=0 embedding vs the time MLP per call
                frozen = ms(lambda: gen.predict(latents, audio))  # noqa: B023
                unfreeze_time(unet)
                plain = MuseTalkGenerator(
                    unet, vae, rt, tokens, batch_size=b, frozen_time=False, warmup=False
                )
                mlp = ms(lambda: plain.predict(latents, audio))  # noqa: B023
                time_mlp = {"batch": b, "frozen_ms": round(frozen, 1), "time_mlp_ms": round(mlp, 1)}
            bar.advance(task)

    naive_ms = float(np.mean(naive))
    best = min(rows, key=lambda r: r["frame_ms"]) if rows else None
    result = {
        "meta": {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "threads": torch.get_num_threads(),
            "loadavg_at_end": os.getloadavg(),
            "torch": torch.__version__,
            "tiny": args.tiny,
            "build_random_s": round(build_s, 1),
            "utterance_s": UTTERANCE_S,
        },
        "naive": {"ms_per_frame": [round(x, 1) for x in naive], "mean_ms": round(naive_ms, 1)},
        "ours": rows,
        "time_embedding": time_mlp,
        "speedup_best_vs_naive": round(naive_ms / best["frame_ms"], 2) if best else None,
        "best": best,
        "skipped": skipped,
        "total_s": round(time.perf_counter() - start, 1),
    }
    print(f"{'path':<16}{'UNet':>9}{'VAE dec':>9}{'Whisper':>9}{'frame ms':>10}{'fps':>8}   (ms per frame)")
    print(f"{'naive fp32 b1':<16}{'':>27}{naive_ms:>10.1f}{1000 / naive_ms:>8.3f}")
    for r in rows:
        print(
            f"{r['dtype'] + ' b' + str(r['batch']):<16}"
            f"{r['unet_ms_per_frame']:>9.1f}{r['vae_decode_ms_per_frame']:>9.1f}"
            f"{r['whisper_ms_per_frame']:>9.2f}{r['frame_ms']:>10.1f}{r['frames_per_s']:>8.3f}"
        )
    print(
        f"speedup of the best path over naive: {result['speedup_best_vs_naive']}x; t=0 embedding: {time_mlp}"
    )
    print(f"skipped: {skipped or 'none'}; total {result['total_s']} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def plot(result: dict, path: Path) -> None:
    """Stacked bars: UNet, VAE decode and Whisper ms per frame for each path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["ours"]
    labels = ["naive\nfp32 b1"] + [f"{r['dtype']}\nb{r['batch']}" for r in rows]
    unet = [0.0] + [r["unet_ms_per_frame"] for r in rows]
    vae = [0.0] + [r["vae_decode_ms_per_frame"] for r in rows]
    whisper = [0.0] + [r["whisper_ms_per_frame"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(labels[:1], [result["naive"]["mean_ms"]], color="grey", label="naive (all per frame)")
    ax.bar(labels, unet, label="UNet")
    ax.bar(labels, vae, bottom=unet, label="VAE decode")
    ax.bar(labels, whisper, bottom=np.add(unet, vae), label="Whisper (amortised)")
    ax.set_ylabel("ms per frame")
    title = "MuseTalk on CPU, " + ("tiny widths" if result["meta"]["tiny"] else "full-size random weights")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
