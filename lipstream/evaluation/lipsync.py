"""Lip-sync of any video, measured from the video alone: mouth aperture (face landmarks on every decoded
frame) against the speech envelope (per-frame RMS) of its own audio track or another file."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from lipstream.audio.decode import load_audio
from lipstream.audio.levels import SilenceDetector, frame_rms
from lipstream.avatar.face_measures import lip_aperture
from lipstream.avatar.progress import frame_progress
from lipstream.avatar.tracking import FaceTracker
from lipstream.avatar.video_source import iter_frames, probe_video
from lipstream.errors import FaceNotFoundError, MediaError

MAX_LAG = 5  # frames searched either side (±200 ms)
ENVELOPE_FLOOR_DBFS = -60.0  # envelope clipped here: quieter than this is all "silence" to the eye
MIN_FRAMES = 10


@dataclass(frozen=True)
class ClosedRule:
    """A frame's mouth is closed when its aperture is within `share` of the video's own range above its
    closed baseline, or within `min_margin` of it for a mouth that barely moves.

    The baseline is the `low_pct` percentile of the aperture after a running median of `sustain` frames:
    the lowest opening the mouth *holds*. Brief bilabial closures (1-3 frames) do not set it, so an
    avatar whose resting lips are parted (a smile showing teeth) keeps that rest pose as "closed".
    """

    sustain: int = 7
    low_pct: float = 5.0
    high_pct: float = 95.0
    share: float = 0.25
    min_margin: float = 0.02  # in eye-corner distances


@dataclass
class LipsyncReport:
    """What `lipstream eval lipsync` measures."""

    video: str
    audio: str
    frames: int
    faces_found: int
    best_lag_frames: int  # > 0: the mouth moves after the sound
    correlation_best: float
    correlation_lag0: float
    correlation_speech_lag0: float  # lag 0, speech frames only: how well opening follows loudness in speech
    silent_frames: int
    silent_closed_share: float | None  # None when the audio has no silent frames
    closed_baseline: float
    closed_threshold: float

    def as_dict(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


def video_apertures(video: Path, progress: bool = True, tracker: FaceTracker | None = None) -> np.ndarray:
    """Aperture per 25 fps frame of `video`; NaN where no face was found."""
    info = probe_video(video)
    out = np.full(info.frame_count, np.nan, dtype=np.float64)
    own = tracker is None
    tracker = tracker or FaceTracker()
    try:
        with frame_progress("tracking lips", info.frame_count, progress) as advance:
            for index, frame in iter_frames(info):
                landmarks = tracker.track(frame)
                if landmarks is not None:
                    out[index] = lip_aperture(landmarks)
                advance()
    finally:
        if own:
            tracker.close()
    return out


def envelope_dbfs(pcm16k: np.ndarray) -> np.ndarray:
    """Per-frame RMS level in dBFS, clipped below at ENVELOPE_FLOOR_DBFS."""
    return np.maximum(frame_rms(pcm16k), ENVELOPE_FLOOR_DBFS).astype(np.float64)


def lagged_correlations(
    envelope: np.ndarray, aperture: np.ndarray, max_lag: int = MAX_LAG
) -> dict[int, float]:
    """Pearson r of envelope[t] with aperture[t + lag] for each lag in [-max_lag, max_lag]."""
    out: dict[int, float] = {}
    n = min(len(envelope), len(aperture))
    for lag in range(-max_lag, max_lag + 1):
        a = envelope[max(0, -lag) : n - max(0, lag)]
        b = aperture[max(0, lag) : n - max(0, -lag)]
        ok = np.isfinite(a) & np.isfinite(b)
        if ok.sum() < 3 or np.std(a[ok]) == 0 or np.std(b[ok]) == 0:
            out[lag] = 0.0
        else:
            out[lag] = float(np.corrcoef(a[ok], b[ok])[0, 1])
    return out


def closed_threshold(aperture: np.ndarray, rule: ClosedRule) -> tuple[float, float]:
    """(baseline, threshold) of the closed mouth from the video's own aperture distribution."""
    from scipy.ndimage import median_filter

    valid = aperture[np.isfinite(aperture)]
    held = median_filter(valid, size=rule.sustain, mode="nearest")
    low = float(np.percentile(held, rule.low_pct))
    high = float(np.percentile(valid, rule.high_pct))
    return float(low), float(low + max(rule.share * (high - low), rule.min_margin))


def measure_lipsync(
    video: str | Path,
    audio: str | Path | None = None,
    progress: bool = True,
    silence: SilenceDetector | None = None,
    rule: ClosedRule | None = None,
    tracker: FaceTracker | None = None,
) -> tuple[LipsyncReport, np.ndarray, np.ndarray, np.ndarray]:
    """(report, envelope, aperture, silent mask) for a video, with its own audio or `audio`.

    `tracker`: a FaceTracker (or anything with its track/close) to use instead of a fresh one.
    """
    video = Path(video)
    audio_path = Path(audio) if audio else video
    silence = silence or SilenceDetector()
    rule = rule or ClosedRule()
    pcm = load_audio(audio_path)
    aperture = video_apertures(video, progress, tracker)
    env = envelope_dbfs(pcm)
    n = min(len(env), len(aperture))
    if n < MIN_FRAMES:
        raise MediaError(
            f"{video.name} and its audio overlap for only {n} frames; give at least {MIN_FRAMES} (0.4 s)"
        )
    env, aperture = env[:n], aperture[:n]
    found = int(np.isfinite(aperture).sum())
    if found < MIN_FRAMES:
        raise FaceNotFoundError(
            f"a face was found in only {found} of {n} frames of {video.name}; "
            "give a video with a visible face"
        )
    silent = silence.mask_from_levels(frame_rms(pcm)[:n])
    corr = lagged_correlations(env, aperture)
    speech = ~silent
    in_speech = lagged_correlations(env[speech], aperture[speech], max_lag=0)[0] if speech.sum() >= 3 else 0.0
    best = max(corr, key=lambda lag: (round(corr[lag], 6), -abs(lag)))
    baseline, threshold = closed_threshold(aperture, rule)
    silent_ok = silent & np.isfinite(aperture)
    share = float(np.mean(aperture[silent_ok] <= threshold)) if silent_ok.any() else None
    report = LipsyncReport(
        video=str(video),
        audio=str(audio_path),
        frames=n,
        faces_found=found,
        best_lag_frames=int(best),
        correlation_best=round(corr[best], 4),
        correlation_lag0=round(corr[0], 4),
        correlation_speech_lag0=round(in_speech, 4),
        silent_frames=int(silent.sum()),
        silent_closed_share=None if share is None else round(share, 4),
        closed_baseline=round(baseline, 5),
        closed_threshold=round(threshold, 5),
    )
    return report, env, aperture, silent


def plot_lipsync(
    path: Path, report: LipsyncReport, envelope: np.ndarray, aperture: np.ndarray, silent: np.ndarray
) -> None:
    """Write a PNG of aperture and envelope over time, silent frames shaded, closed threshold drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(len(envelope)) / 25.0
    fig, ax = plt.subplots(figsize=(12, 4), dpi=100)
    ax.plot(t, aperture, color="tab:red", lw=1.2, label="mouth aperture (inner lips / eye width)")
    ax.axhline(report.closed_threshold, color="tab:red", ls=":", lw=1, label="closed threshold")
    ax.set_xlabel("seconds")
    ax.set_ylabel("aperture")
    ax2 = ax.twinx()
    ax2.plot(t, envelope, color="tab:blue", lw=1.0, alpha=0.8, label="speech envelope (dBFS)")
    ax2.set_ylabel("dBFS")
    for start in np.flatnonzero(np.diff(np.concatenate([[0], silent.astype(int)])) == 1):
        end = start + int(np.argmin(silent[start:])) if not silent[start:].all() else len(silent)
        ax.axvspan(start / 25.0, end / 25.0, color="0.9", zorder=0)
    closed = "n/a" if report.silent_closed_share is None else f"{report.silent_closed_share:.0%}"
    ax.set_title(
        f"r={report.correlation_best:.2f} at lag {report.best_lag_frames:+d} "
        f"(r0={report.correlation_lag0:.2f}, speech only {report.correlation_speech_lag0:.2f}); "
        f"silent frames closed: {closed}"
    )
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
