"""The registry of named benchmark scenarios: the module each runs, what it measures, its headline figures."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Headline:
    """One headline figure read from a script's raw JSON: its name, its path there ("a > b > 0": keys and
    list indices), unit and goal; `scale` converts units (a share to %, bytes to GB)."""

    name: str
    path: str
    unit: str
    goal: str | None = None
    scale: float = 1.0


@dataclass(frozen=True)
class Scenario:
    """A named scenario: its module, benchmarks/scenarios/<module>.py (named after the scenario; two scenarios
    may share one), whose `main(argv)` runs it, fixed leading arguments,
    a one-line description, the raw JSON the script writes (relative to benchmarks/results), the
    headline figures the runner records from it (none: the script records its own), the arguments a
    run needs (`usage`, part of the command that reproduces its figures), and whether `before_after` runs this
    checkout's script on both trees (`same_script`: it measures the lipstream it imports, and an older tree's
    own script compared two trees itself)."""

    name: str
    module: str
    description: str
    args: tuple[str, ...] = ()
    raw: str | None = None
    headlines: tuple[Headline, ...] = field(default_factory=tuple)
    usage: str = ""
    same_script: bool = False


H, S = Headline, Scenario
AVATARS = "--avatars-dir $LIPSTREAM_HOME/avatars"
FULL = "sizes > full 1080x1920"
R_AT_0 = "lipsync > correlation_lag0"

SCENARIOS: tuple[Scenario, ...] = (
    # avatars, engines and offline rendering
    S("prepare", "prepare", "avatar preparation speed and tracking accuracy, 1080x1920 sample clip",
      raw="prepare_bench.json", headlines=(
          H("prepare_avatar, 10 s 1080x1920 clip", "stages > prepare > fps", "fps", ">= 25"),
          H("crop box tracking error, mean", "tracking > smoothed_box > mean_px", "px", "<= 3"))),
    S("prepare_stages", "prepare_stages",
      "avatar preparation per stage, small face on a 1080x1920 clip (records its figures)", same_script=True),
    S("lipsync", "lipsync", "viseme engine lip-sync r, silent frames closed, ms (held-out speech)",
      raw="lipsync_bench.json", headlines=(
          H("lip-sync r at lag 0, Piper, timings", f"cases > piper-text > {R_AT_0}", "r", ">= 0.6"),
          H("lip-sync r at lag 0, Piper, audio only", f"cases > piper-audio > {R_AT_0}", "r", ">= 0.6"),
          H("lip-sync r at lag 0, espeak, timings", f"cases > espeak-text > {R_AT_0}", "r", ">= 0.6"),
          H("lip-sync r at lag 0, espeak, audio only", f"cases > espeak-audio > {R_AT_0}", "r", ">= 0.6"),
          H("silent frames closed, Piper, timings", "cases > piper-text > lipsync > silent_closed_share", "%",
            ">= 90", 100.0),
          H("viseme engine per frame, Piper, timings", "cases > piper-text > total_ms", "ms", "<= 5"))),
    S("render", "render", "offline render speed, ~30 s speech on the 1080x1920 sample, whole path",
      raw="render_bench.json", headlines=(
          H("offline render, default settings", "best_default_realtime_factor", "x real time", ">= 2.0"),
          H("compositor per frame", "runs > 0 > stage_ms > compositor", "ms", "<= 3"),
          H("engine per frame in the render", "runs > 0 > stage_ms > engine", "ms", "<= 5"))),
    S("accel", "accel", "acceleration: engine passes per frame, quality cost, speed with and without",
      raw="accel_bench.json", headlines=(
          H("engine passes per frame, viseme, seeded", "engines > 0 > seeded > neural_ratio", "ratio",
            "<= 0.25"),
          H("mouth PSNR vs no-accel, viseme, seeded", "engines > 0 > seeded > psnr_mean_db", "dB", ">= 30"))),
    S("viseme_speed", "viseme_speed", "weight-free engine ms per frame (features + render)",
      raw="viseme_speed_bench.json", headlines=(
          H("weight-free engine per frame (features + render)", "median > total_ms", "ms", "<= 2"),),
      same_script=True),
    S("viseme_equality", "viseme_equality",
      "weight-free engine draws the same patches as another commit (a two-tree check; pass/fail)",
      usage="--before REV"),
    S("realism", "realism", "weight-free mouth realism: speed, lip-sync, amplitude, jaw, atlas fidelity",
      raw="realism_bench.json", headlines=(
          H("engine per frame, sample, Piper timings", "cases > sample piper timings > total_ms", "ms",
            "<= 2"),
          H("lip gap / width median, sample, Piper timings",
            "cases > sample piper timings > gap_over_width_median", "ratio")), same_script=True),
    S("blink", "blink", "blinks a face mesh finds in rendered speech",
      raw="blink_bench.json", headlines=(
          H("blinks a minute while speaking, one-photo avatar",
            "cases > photo > blinks_per_minute", "per min", ">= 6"),
          H("frames a blink reads shut (face mesh, median), one-photo avatar",
            "cases > photo > shut_frames_median", "frames", ">= 2"),
          H("frames a blink reads under 0.55 of median openness (median), one-photo avatar",
            "cases > photo > frames_under_threshold_median", "frames", "5-8")), same_script=True),
    S("utterance_edges", "utterance_edges", "how far the mouth jumps where speech meets the footage",
      raw="edges_bench.json", headlines=(
          H("largest mouth step at speech end, sample",
            "cases > sample, quiet ends > eased (after) > end_max_step", "px"),
          H("largest mouth step at speech start, sample",
            "cases > sample, quiet ends > eased (after) > start_max_step", "px"))),
    S("musetalk_on_cpu", "musetalk_on_cpu", "MuseTalk on this CPU: full-size random weights, fp32/bf16",
      raw="musetalk_cpu.json", headlines=(
          H("MuseTalk UNet per frame, CPU, best path", "best > unet_ms_per_frame", "ms"),
          H("MuseTalk VAE decode per frame, CPU, best path", "best > vae_decode_ms_per_frame", "ms"))),
    S("musetalk_on_gpu", "musetalk_on_gpu", "MuseTalk on a CUDA GPU: fp16, batch 4/8/16 (needs a GPU)",
      raw="gpu_musetalk.json", headlines=(
          H("MuseTalk UNet+VAE, GPU, batch 8", "runs > 1 > unet_vae_fps", "fps", ">= 100"),
          H("MuseTalk 30 s stream, GPU, batch 8", "stream > frames_per_s", "fps"))),
    S("media", "media", "Mp4Writer and live H.264 ms per frame, RGB->YUV, TTS real-time factor",
      raw="media_bench.json", headlines=(
          H("live H.264 encode per frame, 1080x1920", "h264_1080x1920 > ms_per_frame", "ms"),
          H("Piper TTS real-time factor", "tts > piper > rtf", "x (lower is faster)"))),
    # live serving
    S("serve", "serve", "live server over a WebSocket: first frame, fps, sessions, interrupt",
      raw="serve_bench.json", headlines=(
          H("speak -> first frame p50, full size", f"{FULL} > ttff_ms > p50", "ms", "<= 300"),
          H("speak -> first frame p95, full size", f"{FULL} > ttff_ms > p95", "ms", "<= 300"),
          H("interrupt -> ack p50, full size", f"{FULL} > interrupt_ack_ms_p50", "ms")),
      usage=f"{AVATARS} --avatar sample --requests 6 --seconds 6 --max-concurrent 3"),
    S("browser", "browser", "the player page in headless Chromium: A/V offset, drops, interrupt",
      raw="browser_bench.json", headlines=(
          H("A/V offset p95 in the page, full size", f"{FULL} > av_offset_ms > p95", "ms", "<= 40"),
          H("interrupt -> last speech frame shown, full size", f"{FULL} > interrupt_to_last_speech_frame_ms",
            "ms", "<= 150"),
          H("frames dropped in the page, full size, ~30 s", f"{FULL} > frames_dropped", "frames")),
      usage=f"{AVATARS} --avatar sample"),
    S("first_frame", "first_frame", "speak -> first speech frame shown in the page, 2-25 words",
      raw="first_frame_bench.json", headlines=(
          H("speak -> first speech frame shown p50, 2-25 words, whole frames", "modes > full > p50", "ms",
            "<= 250"),
          H("speak -> first speech frame shown max, 2-25 words, whole frames", "modes > full > max", "ms",
            "<= 300"),
          H("speak -> first speech frame shown p50, 2-25 words, patch", "modes > patch > p50", "ms",
            "<= 250"),
          H("speak -> first speech frame shown max, 2-25 words, patch", "modes > patch > max", "ms",
            "<= 300")),
      usage=f"{AVATARS} --avatar sample"),
    S("phrase_seam", "phrase_seam",
      "waveform and spectrogram around the first-phrase cut, beside the sentence whole (a PNG and a WAV)",
      usage="--voice piper"),
    S("idle_stream", "idle_stream",
      "an idle full-size stream's CPU, live encode vs the replayed idle loop (records its figures)"),
    S("sessions", "sessions", "live sessions holding 25 fps, full and half size (whole frames)",
      raw="sessions_bench.json", headlines=(
          H("sessions holding 25 fps, full size, whole frames", "sizes > full > max_sessions_holding_25fps",
            "sessions"),
          H("sessions holding 25 fps, half size, whole frames", "sizes > half > max_sessions_holding_25fps",
            "sessions"))),
    S("sessions_patch", "sessions", "patch stream vs whole frames: sessions holding 25 fps, bitrate",
      args=("--streams", "full", "patch", "--out", "benchmarks/results/sessions_patch_bench.json"),
      raw="sessions_patch_bench.json", headlines=(
          H("sessions holding 25 fps, full size, patch stream",
            "streams > patch > max_sessions_holding_25fps", "sessions", ">= 10"),
          H("patch stream per session while speaking",
            "streams > patch > sessions > 1 > kbit_per_s_per_session", "kbit/s"))),
    S("workers", "workers", "full-size patch sessions holding 25 fps, serve --workers 1 vs 2",
      raw="workers_bench.json", headlines=(
          H("patch sessions holding 25 fps, --workers 1", "sessions_holding_25fps > 1", "sessions", ">= 20"),
          H("patch sessions holding 25 fps, --workers 2", "sessions_holding_25fps > 2", "sessions",
            ">= 20"))),
    S("abuse", "abuse", "a witness session streams while abusive clients run (hardening)",
      raw="abuse_bench.json", headlines=(
          H("worst witness stall beyond cadence", "runs > after > worst_witness_stall_ms", "ms", "<= 200"),),
      usage=AVATARS),
    S("opus", "opus", "Opus vs PCM audio: three full-size patch pages at once, kbit/s at the page",
      raw="opus_bench.json", headlines=(
          H("per page, whole session, Opus", "summary > opus > kbit_per_s_session", "kbit/s", "<= 200"),
          H("per page, whole session, PCM", "summary > pcm > kbit_per_s_session", "kbit/s")),
      usage=AVATARS),
    S("scaling", "scaling", "serve --ray on a local Ray cluster vs direct serve: overhead, failover",
      raw="ray_bench.json", headlines=(
          H("failover: replica killed -> streaming again", "failover > streaming_again_after_ms", "ms"),),
      usage=f"{AVATARS} --max-sessions 4 --parts hold,scaling"),
    S("livekit", "livekit", "LiveKit avatar worker: fps, first frame, lip-sync beside render",
      raw="livekit_bench.json", headlines=(
          H("LiveKit video during a reply, i420 full size", "live > i420 full > fps_during_reply", "fps",
            "25 ± 1"),
          H("LiveKit first video after first audio, i420 full size",
            "live > i420 full > first_video_after_first_audio_ms", "ms", "<= 300"))),
    # the conversation
    # the script records its own figures, one set per mode it ran (conversation_bench.record_figures)
    S("conversation", "conversation", "spoken questions to serve --agent: latency, WER, memory",
      raw="conversation_bench.json"),
    S("conversations", "conversations",
      "N spoken conversations at once against one serve --agent: first frame p50/p90/worst, stages, CPU per "
      "process, crossed replies (records its figures)", usage="--avatars-dir $LIPSTREAM_HOME/avatars"),
    S("conversation_parts", "conversation_parts", "VAD ms per window, Whisper ms, embedded LLM tokens/s",
      raw="talk_components.json", headlines=(
          H("VAD per 32 ms window, median", "vad > ms_per_window_median", "ms"),
          H("Whisper STT, 3 s of speech, 2 threads", "stt > cpu_threads_2 > ms_3s", "ms"),
          H("SmolLM2 on llama.cpp, 1 thread", "llm > llama_cpp > threads_1 > tokens_per_s_median",
            "tokens/s"))),
    S("model_answers", "model_answers",
      "answers asked of the embedded model process at once: question -> first token, first phrase, per N",
      raw="model_answers_bench.json", headlines=(
          H("model alone, 4 answers at once: question -> first phrase p50",
            "counts > 4 > first_phrase_ms_p50", "ms"),
          H("model alone, 4 answers at once: question -> first phrase p90",
            "counts > 4 > first_phrase_ms_p90", "ms")), same_script=True),
    S("llm_process", "llm_process", "the embedded LLM out of process: tokens/s, crash recovery, memory",
      raw="llm_process_bench.json", headlines=(
          H("SmolLM2 through the model process", "speed > portable_model_process > tokens_per_s_median",
            "tokens/s"),
          H("model process crash -> next first token, worst", "recovery > max_seconds", "s", "<= 5"),
          H("idle memory, server + model process", "idle_memory > total_mib", "MiB")), same_script=True),
    S("turn_detector", "turn_detector", "end-of-turn detectors judged on the same spoken questions",
      raw="turn_detector_bench.json", headlines=(
          H("unfinished pauses answered early, text rule (of 24)", "summary > text/all > early_answers",
            "questions"),
          H("finished questions kept waiting, text rule (of 24)", "summary > text/all > kept_waiting",
            "questions"))),
    S("echo", "echo", "server-side echo canceller: cost, echo removed, VAD false starts",
      raw="echo_bench.json", headlines=(
          H("echo canceller CPU per 20 ms chunk, median", "summary > ms_per_20ms_chunk_cpu > p50", "ms"),
          H("echo removed, worst case", "summary > attenuation_db_min", "dB"),
          H("VAD false starts on the avatar's own voice", "summary > vad_false_starts_output", "starts"))),
    S("barge_in", "barge_in", "the user talking over the avatar: barge-in starts heard late",
      raw="echo_double_talk_bench.json", headlines=(
          H("barge-in starts heard > 150 ms late (of 210)", "summary > after > gated_missed", "cases"),)),
    S("stt_window", "stt_window",
      "Whisper on the audio's own window vs 30 s: transcript ms and WER, side by side (records its figures)"),
    S("stt_streaming", "stt_streaming",
      "streaming recognition: words committed from the start vs a question read whole, final decode ms and "
      "WER side by side (records its figures)"),
    S("native_isa", "native_isa",
      "Whisper with CTranslate2's instruction set and GEMM library its own or forced, side by side, a fresh "
      "process each (records no figures: docs/operations.md)", raw="native_isa_bench.json"),
    S("knowledge", "knowledge_bench", "knowledge base: indexing and search (records its own figures)"),
    S("knowledge_desk", "knowledge_desk_bench",
      "36 spoken questions about 24 notes to serve --agent --knowledge: right, declined, invented, waterfall "
      "(records its own figures)", usage="--avatars-dir $LIPSTREAM_HOME/avatars"),
    S("knowledge_desk_replies", "knowledge_desk_replies",
      "two knowledge_desk runs' replies word for word, side by side, as Markdown "
      "(docs/knowledge_desk_replies.md)",
      usage="BEFORE.json AFTER.json --labels A B"),
    S("knowledge_heldout", "knowledge_heldout",
      "paraphrased questions on a clinic's notes no threshold was chosen on: words only vs sentence vectors, "
      "side by side (records its figures)"),
    S("knowledge_desk_notes", "knowledge_desk_corpus",
      "writes the knowledge desk's 24 notes and persona to a folder, to try them with serve", usage="FOLDER"),
    # the serverless page
    S("serverless_page", "serverless_page", "the serverless page in headless Chromium: drops, speed",
      raw="edge_bench.json", headlines=(
          H("serverless page: frames dropped, 30 s at 1080x1920", "dropped_frames", "frames", "0"),
          H("serverless page: main-thread ms per frame p95", "main_ms_p95", "ms", "<= 5"),
          H("serverless page: Play -> first frame", "play_to_first_frame_ms", "ms", "<= 300"))),
    S("serverless_musetalk", "serverless_page", "MuseTalk (tiny) in the serverless page: wasm/WebGPU",
      args=("--engine", "musetalk", "--seconds", "6"), raw="edge_bench_musetalk.json", headlines=(
          H("serverless MuseTalk: engine passes per frame, wasm",
            "musetalk_tiny > wasm_plain > engine_passes_per_frame", "ratio"),)),
    S("page_warp", "page_warp", "the page's warp.js in Node: ms per patch, a digest of the patches",
      raw="js_warp_bench.json", headlines=(
          H("page warp.js per patch (Node)", "median_ms_per_patch", "ms"),), same_script=True),
    S("onnx_export", "onnx_export", "lipstream export onnx at full size: time, sizes, the gate",
      raw="edge_export.json", headlines=(
          H("ONNX export, full size, float16", "runs > 0 > export_s", "s"),
          H("ONNX export gate: face PSNR, float16", "runs > 0 > gate > face_psnr_db", "dB", ">= 35"),
          H("ONNX export peak memory, float16", "runs > 0 > peak_rss_gb", "GB"))),
    S("serverless_tts", "serverless_tts", "text -> speech in the serverless page (records its figures)",
      usage="EXPORT_DIR"),
    # the environment
    S("env_setup", "env_setup", "a fresh clone's environment setup: time and disk (--ref LABEL=REF)",
      raw="env_setup_bench.json", headlines=(
          H("fresh clone: make setup", "sides > after > seconds", "s"),
          H("fresh clone: .venv size", "sides > after > sizes > .venv", "GB", None, 1e-9)),
      usage="--ref now=HEAD"),
)

TOOLS = {
    "list": "print the scenarios",
    "table": "regenerate the table at the top of docs/benchmarks.md from benchmarks/results/*.json",
    "convert": "seed benchmarks/results/<scenario>.json from a script's raw JSON written before the schema",
    "before_after": "run one scenario on two trees, alternating: before_after --before REV -- NAME ARGS",
}


def by_name(name: str) -> Scenario:
    """The scenario called `name` (KeyError listing the names when there is none)."""
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    names = ", ".join(s.name for s in SCENARIOS)
    raise KeyError(f"no scenario {name!r}; the scenarios are: {names} (python -m benchmarks list)")
