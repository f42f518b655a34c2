"""MuseTalk on a GPU: full-size random weights, fp16, batch 4/8/16 — UNet, VAE decode, frame ms, fps, memory.

Run as is on a CUDA machine (needs torch, transformers, numpy and diffusers; no cv2/av/mediapipe):
    python -m benchmarks musetalk_on_gpu [--out benchmarks/results/gpu_musetalk.json]
Smoke test on a CPU (tiny widths, a few seconds):
    python -m benchmarks musetalk_on_gpu --device cpu --tiny --out /tmp/gpu_musetalk.json
Variants: eager (SDPA attention, t=0 embedding precomputed), its time-MLP and classic-attention
counterparts, channels_last, and torch.compile; a global time budget skips what does not fit.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout, no install needed

import numpy as np  # noqa: E402
import torch  # noqa: E402

from lipstream.engines.musetalk.features import WINDOW_STEPS, WhisperFeaturizer  # noqa: E402
from lipstream.engines.musetalk.generator import MuseTalkGenerator, freeze_time  # noqa: E402
from lipstream.engines.musetalk.loader import resolve_runtime  # noqa: E402
from lipstream.engines.musetalk.topology import count_params, random_models  # noqa: E402


def sync(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, iters: int) -> float:
    """Median wall milliseconds of fn() over iters runs (after the caller's warm-up)."""
    samples = []
    for _ in range(iters):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def peak_gb(device: torch.device) -> float | None:
    """Peak GPU memory allocated since the last reset, in GB."""
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None


def measure(gen: MuseTalkGenerator, iters: int) -> dict:
    """UNet, VAE decode and whole-step times of one generator at its batch size."""
    dev, dt, b = gen.runtime.device, gen.runtime.dtype, gen.batch_size
    latents = torch.randn((b, *gen.latent_shape), device=dev, dtype=dt)
    audio = torch.randn((b, gen.audio_tokens, gen.pe.shape[1]), device=dev, dtype=dt)
    pred = gen.predict(latents, audio)
    gen.decode(pred)
    unet_ms = timed(lambda: gen.predict(latents, audio), dev, iters)
    vae_ms = timed(lambda: gen.decode(pred), dev, iters)
    step_ms = timed(lambda: gen.run(latents, audio), dev, iters)  # incl. padding logic and copy to host
    return {
        "batch": b,
        "unet_ms": round(unet_ms, 2),
        "vae_decode_ms": round(vae_ms, 2),
        "step_ms": round(step_ms, 2),
        "ms_per_frame": round(step_ms / b, 3),
        "unet_vae_fps": round(1000 * b / (unet_ms + vae_ms), 1),
        "frames_per_s": round(1000 * b / step_ms, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run every variant that fits the time budget; print a table and write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="auto", help="fp16 on CUDA (default), fp32/bf16 on CPU")
    ap.add_argument("--tiny", action="store_true", help="CI widths instead of the full topology")
    ap.add_argument("--batches", default="4,8,16")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    ap.add_argument("--variants", default="eager,time-mlp,classic-attn,channels_last,compile")
    ap.add_argument("--stream-seconds", type=float, default=None, help="audio for the end-to-end run")
    ap.add_argument(
        "--budget-s", type=float, default=400.0, help="skip variants once this much time is spent"
    )
    ap.add_argument("--out", default="benchmarks/results/gpu_musetalk.json")
    args = ap.parse_args(argv)

    start = time.perf_counter()
    runtime = resolve_runtime(args.device, args.dtype)
    dev, dt = runtime.device, runtime.dtype
    batches = [int(b) for b in args.batches.split(",")]
    iters = max(1, args.iters if not args.tiny else 1)
    torch.backends.cudnn.benchmark = True
    unet, vae, encoder, extractor = random_models(tiny=args.tiny, device=dev)
    unet.to(dtype=dt)
    vae.to(dtype=dt)
    encoder.to(dtype=dt if dev.type == "cuda" else torch.float32)
    build_s = time.perf_counter() - start
    featurizer = WhisperFeaturizer(encoder, extractor)
    tokens = WINDOW_STEPS * featurizer.n_states
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": runtime.dtype_name,
        "tiny": args.tiny,
        "unet_params": count_params(unet),
        "cuda": torch.version.cuda,
    }
    try:
        import diffusers
        import transformers

        meta.update(diffusers=diffusers.__version__, transformers=transformers.__version__)
    except ImportError:
        pass
    print(
        f"# MuseTalk GPU benchmark on {meta['device']} ({meta['dtype']}, torch {meta['torch']})", flush=True
    )

    # time to first batch: warm-up of the fixed shape, 1 s of features, one real batch out
    t0 = time.perf_counter()
    gen = MuseTalkGenerator(unet, vae, runtime, tokens, batch_size=batches[0])
    warmup_s = time.perf_counter() - t0
    feats = featurizer.features(np.random.default_rng(0).normal(0, 0.1, 16_000).astype(np.float32))
    lat = torch.randn((batches[0], *gen.latent_shape), device=dev, dtype=dt)
    audio = torch.from_numpy(feats[: batches[0]]).reshape(-1, tokens, featurizer.dim).to(dev, dt)
    gen.run(lat[: len(audio)], audio)
    ttfb = {"build_random_s": round(build_s, 2), "warmup_s": round(warmup_s, 2)}
    ttfb["first_batch_after_warmup_s"] = round(time.perf_counter() - t0 - warmup_s, 3)

    # Whisper: 30 s of audio -> 750 frames of features (mel on the CPU + encoder on the device)
    pcm30 = np.random.default_rng(1).normal(0, 0.1, 30 * 16_000).astype(np.float32)
    featurizer.features(pcm30)
    whisper = {
        "features_30s_ms": round(timed(lambda: featurizer.features(pcm30), dev, max(1, iters // 2)), 1),
        "encoder_30s_ms": round(timed(lambda: featurizer.encode_segment(pcm30), dev, max(1, iters // 2)), 1),
    }
    print(f"whisper 30 s: {whisper}", flush=True)

    procs = unet.attn_processors
    variants = [("eager", {}, batches), ("time-mlp", {"frozen_time": False}, batches[1:2] or batches)]
    variants += [("classic-attn", {"classic": True}, batches[1:2] or batches)]
    variants += [("channels_last", {"channels_last": True}, batches)]
    if not args.no_compile and dev.type == "cuda":  # inductor on CPU needs minutes and a C++ toolchain
        variants += [("compile", {"compile": True}, batches[-2:])]  # each shape compiles anew: the big ones
    wanted = set(args.variants.split(","))
    variants = [v for v in variants if v[0] in wanted]
    runs, skipped = [], []
    for name, opts, bs in variants:
        for b in bs:
            if time.perf_counter() - start > args.budget_s:
                skipped.append(f"{name}@{b}")
                continue
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            if opts.get("classic"):
                from diffusers.models.attention_processor import AttnProcessor

                unet.set_attn_processor(AttnProcessor())
            t1 = time.perf_counter()
            try:
                g = MuseTalkGenerator(
                    unet,
                    vae,
                    runtime,
                    tokens,
                    batch_size=b,
                    compile=opts.get("compile", False),
                    channels_last=opts.get("channels_last", False),
                    frozen_time=opts.get("frozen_time", True),
                )
                setup_s = time.perf_counter() - t1
                row = {"variant": name, **measure(g, iters), "setup_s": round(setup_s, 2)}
                row["peak_gb"] = round(peak_gb(dev), 2) if dev.type == "cuda" else None
            except Exception as exc:  # noqa: BLE001 - a failed variant is a result, not a crash
                row = {"variant": name, "batch": b, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            finally:
                unet.set_attn_processor(dict(procs))  # it consumes the dict
                unet.to(memory_format=torch.contiguous_format)
                vae.to(memory_format=torch.contiguous_format)
                freeze_time(unet, torch.zeros(1, dtype=torch.long, device=dev))
            runs.append(row)
            print(json.dumps(row), flush=True)

    # one stream end to end: features for the clip, then every frame through the eager batch-8 path
    seconds = args.stream_seconds or (1.0 if args.tiny else 30.0)
    b = 8 if 8 in batches else batches[0]
    g = MuseTalkGenerator(unet, vae, runtime, tokens, batch_size=b)
    pcm = np.random.default_rng(2).normal(0, 0.1, int(seconds * 16_000)).astype(np.float32)
    lat_bank = torch.randn((50, *g.latent_shape), device=dev, dtype=dt)
    sync(dev)
    t2 = time.perf_counter()
    feats = featurizer.features(pcm)
    for s in range(0, len(feats), b):
        chunk = torch.from_numpy(feats[s : s + b]).reshape(-1, tokens, featurizer.dim).to(dev, dt)
        g.run(lat_bank[torch.arange(s, s + len(chunk), device=dev) % 50], chunk)
    sync(dev)
    stream_s = time.perf_counter() - t2
    stream = {"audio_s": seconds, "frames": len(feats), "batch": b, "wall_s": round(stream_s, 2)}
    stream["frames_per_s"] = round(len(feats) / stream_s, 1)

    result = {"meta": meta, "time_to_first_batch": ttfb, "whisper": whisper, "runs": runs, "stream": stream}
    result["skipped"] = skipped
    result["total_s"] = round(time.perf_counter() - start, 1)
    print(
        f"\n{'variant':<14}{'batch':>6}{'UNet ms':>10}{'VAE ms':>10}{'step ms':>10}{'ms/frame':>10}"
        f"{'fps':>8}{'peak GB':>9}"
    )
    for r in runs:
        if "error" in r:
            print(f"{r['variant']:<14}{r['batch']:>6}  error: {r['error'][:80]}")
            continue
        peak = "-" if r["peak_gb"] is None else f"{r['peak_gb']:.2f}"
        print(
            f"{r['variant']:<14}{r['batch']:>6}{r['unet_ms']:>10.1f}{r['vae_decode_ms']:>10.1f}"
            f"{r['step_ms']:>10.1f}{r['ms_per_frame']:>10.2f}{r['frames_per_s']:>8.1f}{peak:>9}"
        )
    print(
        f"stream: {stream}\ntime to first batch: {ttfb}\n"
        f"skipped: {skipped or 'none'}; total {result['total_s']} s"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
