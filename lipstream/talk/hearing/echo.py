"""Server-side acoustic echo cancellation for the microphone path: remove the avatar's own voice.

The server knows every sample it sent (`add_reference`) and, from the player's position reports, which
of them the loudspeaker is playing when each microphone chunk is captured (`process`). What it does not
know is the extra delay (output latency, microphone buffering: 0–300 ms; or even up to 200 ms *early*, since
the position at capture is only an estimate) nor the room's response, so:

1. delay: GCC-PHAT between the microphone and the reference over all candidate lags, on cross-spectra
   averaged across 256 ms analysis blocks, accepted when the peak stands well above the rest;
2. linear cancellation: a partitioned-block frequency-domain NLMS filter (MDF; 128-sample blocks,
   1024 taps starting a little before the estimated delay) run as a background filter that adapts and a
   foreground filter that is used, copied from the background only when it cancels better;
3. double talk (the microphone correlates < 0.75 with the echo estimate, or is far louder than it) cuts
   the step tenfold and freezes the statistics; otherwise the step is the ratio of the estimated residual
   echo to the error, per frequency bin, the residual's level ("leakage") estimated by regressing the
   error's power on the echo estimate's power (Valin 2007);
4. residual suppression: a broadband gain, down to -30 dB, where the residual is still explained by the
   reference (the leakage above, or the echo estimate accounting for ≥ 95 % of the microphone's power),
   so the user's own voice, which the reference cannot explain, passes at full level.

No lookahead: every output sample is produced when its input sample arrives (the echo estimate of a
block is computed at its first sample from the reference, which the server sends ahead of playback).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from lipstream.talk.hearing.echo_delay import DelayEstimator, ReferenceBuffer

__all__ = ["EchoCanceller", "EchoStats"]

log = logging.getLogger(__name__)

_SILENT_POWER = 1e-10  # mean square below this (−100 dBFS) counts as no signal at all
_EPS = 1e-12


@dataclass
class EchoStats:
    """What the canceller currently believes, for logging and tests."""

    delay_ms: float | None = None  # estimated echo delay after the reported playback position
    delay_confidence: float = 0.0  # GCC-PHAT peak over the rms of the other lags (≥ 8: accepted)
    erle_db: float = 0.0  # echo return loss enhancement of the linear filter, smoothed
    suppression_db: float = 0.0  # extra attenuation of the residual suppressor on the last block
    reference_active: bool = False  # the avatar's audio can be heard at the microphone right now
    double_talk: bool = False  # the microphone carries energy the reference cannot explain
    adapted: bool = False  # the filter has removed ≥ 10 dB once since the delay was (re)found
    louder_than_echo: bool = False  # adapted, and what is left after cancelling outweighs the echo estimate
    converged: bool = False  # delay known and the linear filter removes ≥ 10 dB
    converged_ms: float = 0.0  # how long (microphone time) the filter has stayed converged; 0 when not
    search_ms: float = 0.0  # how long the avatar was audible before a delay was found (grows until then)
    resyncs: int = 0  # times the reported playback position jumped away from the locked timeline


class EchoCanceller:
    """Removes the avatar's own voice (the reference) from one session's microphone stream (16 kHz)."""

    # Step sizes (normalised, per bin). Until the filter removes ERLE_SWITCH dB a fixed large step gets it
    # there fast (measured: ~20 dB within 0.5 s of the delay lock); after that the double-talk-aware step.
    MU_START = 0.8
    ERLE_SWITCH = 10.0
    MU_MIN = 0.05
    DT_RHO = 0.75  # correlation of mic and echo estimate below which a block is double talk
    MU_MAX = 0.8
    # An error (microphone minus echo estimate) this far under the echo estimate (power ratio, -10 dB) is
    # residual echo: the voice activity detector hears silence there (silero hears speech even 40 dB down,
    # so suppression alone is not enough). A user at most 10 dB quieter than the avatar's echo at the
    # microphone is still heard meanwhile. (At -6 dB, a user as loud as the echo on average lost their
    # first ~0.6 s to it wherever a syllable of the echo peaked: benchmarks/echo_double_talk_bench.py.)
    RESIDUAL_RATIO = 0.1

    def __init__(
        self,
        sample_rate: int = 16000,
        max_delay_ms: float = 300.0,
        max_lead_ms: float = 200.0,
        block: int = 128,
        partitions: int = 8,
        pre_delay_ms: float = 8.0,
        resync_ms: float = 80.0,
        suppress: bool = True,
        suppress_floor_db: float = -30.0,
        history_s: float = 8.0,
    ) -> None:
        if sample_rate != 16000:
            raise ValueError(f"EchoCanceller works at 16000 Hz (got {sample_rate}); resample first")
        if block < 16 or partitions < 1:
            raise ValueError("block must be ≥ 16 samples and partitions ≥ 1")
        self.sample_rate = sample_rate
        self.block = block
        self.partitions = partitions
        self.taps = block * partitions
        self.pre = int(round(pre_delay_ms * sample_rate / 1000))
        self.max_lag = int(round(max_delay_ms * sample_rate / 1000))
        # The echo may also be heard *before* the position the caller gives: that is only an estimate
        # (client reports extrapolated to a chunk's arrival, clamped to the frames produced so far, a
        # client clock behind its loudspeaker); measured live: 10-50 ms early. So the search also covers
        # negative delays, down to -max_lead_ms (the reference is sent ahead, so it is there to read).
        self.lead = max(self.pre, int(round(max_lead_ms * sample_rate / 1000)))
        self.resync = int(round(resync_ms * sample_rate / 1000))
        self.suppress = suppress
        self.gain_floor = 10 ** (suppress_floor_db / 20)
        self._ref = ReferenceBuffer(int(history_s * sample_rate))
        self._delay = DelayEstimator(self.max_lag, neg=self.lead)
        self.stats = EchoStats()
        nb = block + 1
        self._wf = np.zeros((partitions, nb), dtype=np.complex128)  # foreground (used) filter
        self._wb = np.zeros((partitions, nb), dtype=np.complex128)  # background (adapting) filter
        self._xh = np.zeros((partitions, nb), dtype=np.complex128)  # reference spectra, newest first
        self._xh_next: int | None = None  # reference position the next block continues from
        self._sxx = np.zeros(nb)  # smoothed reference power per bin
        self._syy = np.zeros(nb)  # smoothed echo-estimate power per bin
        self._see = np.zeros(nb)  # smoothed error power per bin
        # Leakage regression (residual echo power against echo-estimate power, block by block).
        self._mean_e = self._mean_y = self._cov_ey = self._var_y = 0.0
        self._leak = 1.0
        self._ref_blocks = 0  # blocks with an audible reference since the filter (re)started
        self._adapted = False  # the filter has reached ERLE_SWITCH once since it (re)started
        self._dt_hold = 0  # blocks of double talk still to assume
        self._sff = self._sbb = self._sdd = 0.0  # smoothed error powers: foreground, background, mic
        self._erle_d = self._erle_e = _EPS
        self._noise = 1e-7  # error power with no echo and no user (background noise), tracked
        # Timeline: microphone sample m was captured while playback pts m + offset was heard.
        self._offset: int | None = None
        self._mic_count = 0
        self._d0: int | None = None  # reference lag of filter tap 0 (estimated delay - pre)
        # The block in progress.
        self._fill = 0
        self._blk_mic = np.zeros(block)
        self._blk_err = np.zeros(block)
        self._blk_yf = np.zeros(block)
        self._blk_yb = np.zeros(block)
        self._blk_active = False
        self._blk_x: np.ndarray | None = None
        self._gain = 1.0
        # Microphone history for the delay estimator.
        self._mic_hist = np.zeros(self._delay.block)
        self._hist_fill = 0
        self._since_analysis = 0
        self._hist_offset: int | None = None

    # -- public API -------------------------------------------------------------------------------------

    def add_reference(self, pts: int, pcm: np.ndarray) -> None:
        """Record audio the avatar plays at `pts` (16 kHz samples on the session timeline); int16 or float."""
        pcm = np.asarray(pcm).reshape(-1)
        data = pcm.astype(np.float64) / 32768.0 if pcm.dtype == np.int16 else pcm.astype(np.float64)
        self._ref.write(int(pts), data)

    @property
    def echo_likely(self) -> bool:
        """The avatar is audible and the output may still hold its echo (no delay yet, or ERLE < 15 dB)."""
        s = self.stats
        return s.reference_active and (s.delay_ms is None or s.erle_db < 15.0)

    def process(self, mic: np.ndarray, playback_pts_at_end: int | None) -> np.ndarray:
        """Cancel the echo in one microphone chunk (float32 16 kHz, any length); same length back.

        `playback_pts_at_end`: the playback position being heard when the chunk's last sample was captured
        (None: unknown; the last known timeline is extrapolated, or the chunk passes untouched)."""
        return self.process_gated(mic, playback_pts_at_end)[0]

    def process_gated(
        self, mic: np.ndarray, playback_pts_at_end: int | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`process`, plus a mask of the samples that hold nothing but residual echo (for the VAD)."""
        d = np.asarray(mic, dtype=np.float32).reshape(-1)
        n = len(d)
        echo_only = np.zeros(n, dtype=bool)
        if n == 0:
            return d.copy(), echo_only
        self._sync(playback_pts_at_end, n)
        out = np.empty(n, dtype=np.float32)
        i = 0
        while i < n:
            if self._fill == 0:
                self._start_block(self._mic_count + i)
            take = min(self.block - self._fill, n - i)
            seg = d[i : i + take]
            lo, hi = self._fill, self._fill + take
            self._blk_mic[lo:hi] = seg
            if self._blk_active:
                out[i : i + take] = self._cancel(seg, lo, hi)
                echo_only[i : i + take] = self._residual_only(hi)
            else:
                out[i : i + take] = seg  # bit-exact pass-through: nothing to cancel
                self._gain = 1.0
            self._fill = hi
            i += take
            if self._fill == self.block:
                self._finish_block()
                self._fill = 0
        self._mic_count += n
        self._track_delay(d)
        return out, echo_only

    # -- timeline ---------------------------------------------------------------------------------------

    def _sync(self, pts_end: int | None, n: int) -> None:
        if pts_end is None:
            return  # keep extrapolating the last timeline (or stay unsynced)
        last = self._mic_count + n - 1
        if self._offset is None:
            self._offset = int(pts_end) - last
            return
        # The caller estimates the position from 100 ms reports, so wobbles are ignored (measured live: it
        # drifts 40 ms for a second while the server is busy, then comes back; a small real change is
        # followed by the delay search and the filter); a real jump (playback restarted, a stall) moves
        # the timeline, while the acoustic delay stays what it was.
        if abs(int(pts_end) - (last + self._offset)) > self.resync:
            log.info(
                "playback timeline moved %+.0f ms at microphone sample %d: resynchronised",
                (int(pts_end) - (last + self._offset)) * 1000 / self.sample_rate, last,
            )
            self._offset = int(pts_end) - last
            self._xh_next = None
            self._delay.reset()
            self._hist_fill = 0
            self.stats.resyncs += 1
            self.stats.converged_ms = 0.0  # convergence on the new timeline is yet to be seen

    # -- adaptive filter --------------------------------------------------------------------------------

    def _start_block(self, m: int) -> None:
        """Compute the echo estimate of the block starting at microphone sample m (the reference is known)."""
        B, P = self.block, self.partitions
        self._blk_active = False
        if self._offset is None or self._d0 is None:
            self.stats.reference_active = self._offset is not None and self._ref_audible(m)
            if self.stats.reference_active:
                self.stats.search_ms += B * 1000 / self.sample_rate
            return
        q = m + self._offset - self._d0  # reference pts under tap 0 at the block's start
        span = self._ref.read(q - self.taps - B, q + B)
        if float(np.mean(span * span)) < _SILENT_POWER:
            self.stats.reference_active = False
            self._xh_next = None
            return
        self.stats.reference_active = True
        if self._xh_next == q:
            self._xh = np.roll(self._xh, 1, axis=0)
            self._xh[0] = np.fft.rfft(span[-2 * B :])
        else:
            # Partition i sees the reference i blocks earlier: frames [q-B-iB, q+B-iB) of `span`.
            L = len(span)
            frames = np.stack([span[L - 2 * B - i * B : L - i * B] for i in range(P)])
            self._xh = np.fft.rfft(frames, axis=1)
        self._xh_next = q + B
        x0 = self._xh[0]
        self._sxx = 0.8 * self._sxx + 0.2 * (x0.real**2 + x0.imag**2)
        spec = np.stack([np.sum(self._wf * self._xh, axis=0), np.sum(self._wb * self._xh, axis=0)])
        y = np.fft.irfft(spec, 2 * B, axis=1)[:, B:]
        self._blk_yf[:] = y[0]
        self._blk_yb[:] = y[1]
        self._blk_active = True

    def _ref_audible(self, m: int) -> bool:
        assert self._offset is not None
        p = m + self._offset
        span = self._ref.read(p - self.max_lag - self.taps, p + self.lead + self.block)
        return float(np.mean(span * span)) >= _SILENT_POWER

    def _cancel(self, seg: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """Foreground error of samples lo..hi of the block, through the residual suppressor."""
        y = self._blk_yf[lo:hi]
        e = seg.astype(np.float64) - y
        self._blk_err[lo:hi] = e
        target = 1.0
        if self.suppress and self._ref_blocks > 8:
            # Powers over the block so far, not just this piece: a chunk may end one sample into a block.
            e_so_far, y_so_far, d_so_far = self._blk_err[:hi], self._blk_yf[:hi], self._blk_mic[:hi]
            p_e = float(e_so_far @ e_so_far) / hi
            p_y = float(y_so_far @ y_so_far) / hi
            # Oversubtract ×2: the leakage is an average, the residual of a given block varies around it.
            g2 = 1.0 - 2.0 * self._leak * p_y / (p_e + _EPS)
            target = math.sqrt(max(g2, 0.0))
            if self._adapted:
                # Where the echo estimate explains nearly all of the microphone (≥ 95 % of its power), what
                # is left is echo the filter has not learnt yet (new sounds, a moving room): take it down.
                # A user as loud as the echo explains half the power, so is never touched by this.
                dy = float(d_so_far @ y_so_far) / hi
                explained = dy * dy / ((float(d_so_far @ d_so_far) / hi) * p_y + _EPS)
                target = min(target, float(np.clip((0.95 - explained) / 0.15, 0.0, 1.0)))
            target = max(self.gain_floor, target)
        # Ramp from the last gain so a gain change never clicks.
        ramp = np.linspace(self._gain, target, hi - lo + 1)[1:]
        self._gain = target
        self.stats.suppression_db = -20 * math.log10(max(target, 1e-9))
        return (e * ramp).astype(np.float32)

    def _residual_only(self, hi: int) -> bool:
        """The block so far is echo the filter explains, with nothing of the user's over it: the output is
        far under the echo estimate. Only once the filter has learnt the room (before, its estimate is 0),
        and never while double talk is held: a quiet syllable of the user's under a loud one of the echo."""
        if not self._adapted or self._dt_hold > 0:
            return False
        err, y = self._blk_err[:hi], self._blk_yf[:hi]
        return float(err @ err) < self.RESIDUAL_RATIO * float(y @ y)

    def _finish_block(self) -> None:
        """The block is complete: adapt the background filter and compare it with the foreground."""
        if not self._blk_active:
            return
        B = self.block
        d = self._blk_mic
        ef = d - self._blk_yf
        eb = d - self._blk_yb
        p_d, p_f, p_b = float(d @ d) / B, float(ef @ ef) / B, float(eb @ eb) / B
        p_y = float(self._blk_yf @ self._blk_yf) / B
        self._ref_blocks += 1
        if not self._adapted and self._ref_blocks >= 40 and self.stats.erle_db >= self.ERLE_SWITCH:
            self._adapted = True  # latched: double talk must never send the filter back to the big step
            self.stats.adapted = True

        # Double talk: once the filter works, the microphone of an echo-only block is its echo estimate
        # plus a small residual (correlation ≥ 0.9, power not far above it); the user's voice breaks both.
        # Held 80 ms past the last detection: words fade in and out below any threshold.
        rho = float(d @ self._blk_yf) / math.sqrt(float(d @ d) * float(self._blk_yf @ self._blk_yf) + _EPS)
        self._noise = p_f if p_f < self._noise else self._noise * 1.01  # floor, creeping up 5 dB/s
        unexplained = rho < self.DT_RHO or p_d > 4.0 * (p_y + self._noise)
        if self._adapted and p_d > 4.0 * self._noise and unexplained:
            self._dt_hold = 10
        else:
            self._dt_hold = max(0, self._dt_hold - 1)
        dt = self._dt_hold > 0
        self.stats.double_talk = dt
        # Stricter than double talk (which also fires on echo the young filter does not model yet): an
        # echo-only block leaves ≤ 1/10 of the estimate's power once the filter has removed 10 dB (and a
        # quiet tail of the avatar's voice, under the noise, says nothing either way).
        self.stats.louder_than_echo = self._adapted and p_f > p_y and p_d > 4.0 * self._noise

        # Leakage: regression of the error's power on the echo estimate's power (0.4 s memory), over
        # echo-only blocks, so that the user's voice cannot pass for residual echo.
        if not dt:
            a = 0.98
            self._mean_e = a * self._mean_e + (1 - a) * p_f
            self._mean_y = a * self._mean_y + (1 - a) * p_y
            self._cov_ey = a * self._cov_ey + (1 - a) * (p_f - self._mean_e) * (p_y - self._mean_y)
            self._var_y = a * self._var_y + (1 - a) * (p_y - self._mean_y) ** 2
            if self._var_y > _EPS and self._ref_blocks > 16:
                self._leak = min(max(self._cov_ey / self._var_y, 0.0), 1.0)

        # Step size per bin: residual echo / error (Valin), so error the echo cannot explain slows the
        # adaptation; MU_MIN during detected double talk (not 0: a changed room must still be relearnt).
        # Before the filter has learnt anything there is no echo estimate to compare with: a fixed step,
        # guarded by the foreground copy below.
        E = np.fft.rfft(np.concatenate([np.zeros(B), eb]))
        Yb = np.fft.rfft(np.concatenate([np.zeros(B), self._blk_yb]))
        self._see = 0.7 * self._see + 0.3 * (E.real**2 + E.imag**2)
        self._syy = 0.7 * self._syy + 0.3 * (Yb.real**2 + Yb.imag**2)
        if not self._adapted:
            mu = np.full(B + 1, self.MU_START)
        else:
            # The leakage is a slope over the last 0.4 s and underestimates a residual made of sounds the
            # filter has not met yet; the block's own correlation says how much of the microphone is echo
            # (≥ 90 %: full step, ≤ 50 %, a user as loud as the echo: none), so take the larger of the two.
            mu_rho = self.MU_MAX * min(max((rho * rho - 0.5) / 0.4, 0.0), 1.0)
            mu = np.clip(
                np.maximum(self._leak * self._syy / (self._see + _EPS), mu_rho), self.MU_MIN, self.MU_MAX
            )
            if dt:
                mu = np.minimum(mu, self.MU_MIN)
        norm = mu / (self.partitions * self._sxx + 1e-6 * (1 + self._sxx.max()))
        grad = np.fft.irfft(np.conj(self._xh) * (E * norm), 2 * B, axis=1)
        grad[:, B:] = 0.0  # gradient constraint: the filter stays a linear (not circular) convolution
        self._wb += np.fft.rfft(grad, axis=1)

        # Foreground/background: the used filter only takes the adapted one when it cancels better; when
        # the adapted one goes wrong (double talk slipped through) it is reset to the used one.
        s = 0.85
        self._sff = s * self._sff + (1 - s) * p_f
        self._sbb = s * self._sbb + (1 - s) * p_b
        self._sdd = s * self._sdd + (1 - s) * p_d
        if self._sbb < 0.9 * self._sff and self._sbb < self._sdd:
            self._wf = self._wb.copy()
            self._sff = self._sbb
        elif self._sbb > 4.0 * self._sff + _EPS:
            self._wb = self._wf.copy()
            self._sbb = self._sff

        # ERLE over echo-only blocks: the user's voice would read as bad cancellation.
        if not dt and p_d > _SILENT_POWER:
            self._erle_d = 0.97 * self._erle_d + 0.03 * p_d
            self._erle_e = 0.97 * self._erle_e + 0.03 * p_f
            self.stats.erle_db = 10 * math.log10((self._erle_d + _EPS) / (self._erle_e + _EPS))
        self.stats.converged = self.stats.erle_db >= 10.0
        if self.stats.converged:
            self.stats.converged_ms += B * 1000 / self.sample_rate
        else:
            self.stats.converged_ms = 0.0

    # -- delay ------------------------------------------------------------------------------------------

    def _track_delay(self, d: np.ndarray) -> None:
        """Keep the last analysis block of microphone audio; run GCC-PHAT every hop."""
        if self._offset is None:
            return
        if self._hist_offset != self._offset:
            self._hist_offset, self._hist_fill = self._offset, 0
        hist = self._mic_hist
        n = len(d)
        if n >= len(hist):
            hist[:] = d[-len(hist) :]
        else:
            hist[:-n] = hist[n:]
            hist[-n:] = d
        self._hist_fill = min(len(hist), self._hist_fill + n)
        self._since_analysis += n
        if self._hist_fill < len(hist) or self._since_analysis < self._delay.hop:
            return
        self._since_analysis = 0
        if float(np.mean(hist * hist)) < _SILENT_POWER:
            return
        start = self._mic_count + self._offset - len(hist)  # playback pts of hist[0]
        ref = self._ref.read(start - self.max_lag, start + len(hist) + self.lead)
        # Only blocks where the avatar speaks most of the time say anything about the delay.
        if float(np.mean(ref * ref)) < _SILENT_POWER or np.mean(np.abs(ref) > 1e-4) < 0.3:
            return
        changed = self._delay.update(hist, ref)
        self.stats.delay_confidence = self._delay.confidence
        if changed and self._delay.lag is not None:
            self._set_delay(self._delay.lag)

    def _set_delay(self, lag: int) -> None:
        new_d0 = lag - self.pre
        self.stats.delay_ms = lag * 1000 / self.sample_rate
        if self._d0 is None or abs(new_d0 - self._d0) >= self.taps // 2:
            self._wf[:] = 0
            self._wb[:] = 0
            self._ref_blocks = 0
            self._adapted = False
            self.stats.adapted = False
            self.stats.erle_db = 0.0
            self._erle_d = self._erle_e = _EPS
        else:
            # Same room, the reference just arrives earlier or later: move the taps instead of relearning.
            shift = self._d0 - new_d0
            self._wf = self._shift(self._wf, shift)
            self._wb = self._shift(self._wb, shift)
        self._d0 = new_d0
        self._xh_next = None

    def _shift(self, w: np.ndarray, shift: int) -> np.ndarray:
        B = self.block
        taps = np.fft.irfft(w, 2 * B, axis=1)[:, :B].reshape(-1)
        moved = np.zeros_like(taps)
        if shift >= 0:
            moved[shift:] = taps[: len(taps) - shift]
        else:
            moved[:shift] = taps[-shift:]
        frames = np.zeros((self.partitions, 2 * B))
        frames[:, :B] = moved.reshape(self.partitions, B)
        return np.fft.rfft(frames, axis=1)
