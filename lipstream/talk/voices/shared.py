"""Voices loaded once and shared: a server's sessions, its /api/tts and its conversations use the same."""

from __future__ import annotations

import threading

from lipstream.talk.voices.tts import TTS, create_tts


class SharedVoices:
    """TTS voices loaded on first use and kept (loading a voice takes about a second)."""

    def __init__(self, threads: int = 1, warm_up: bool = True, keep_arena: bool = False) -> None:
        """`threads`: CPU threads one synthesis may use (1 on a server: sessions share the CPU; 0: all);
        `warm_up`: pay the slow first synthesis at load, not on the first sentence someone waits for;
        `keep_arena`: Piper keeps onnxruntime's memory arena, for voices that speak short sentences only
        (a conversation's answers, cut at 240 characters): without it each synthesis in a busy server
        takes ~50k page faults and ~1.5x its CPU time (issue 35), with it the arena holds the peak of the
        longest sentence (~100 MB)."""
        self.threads = threads
        self.warm_up = warm_up
        self.keep_arena = keep_arena
        self._voices: dict[str, TTS] = {}
        self._lock = threading.Lock()

    def __call__(self, voice: str) -> TTS:
        """The loaded voice called `voice` (loaded on first use)."""
        with self._lock:
            if voice not in self._voices:
                tts = create_tts(voice, threads=self.threads, keep_arena=self.keep_arena)
                if self.warm_up:
                    tts.synthesize("Ready.")
                self._voices[voice] = tts
            return self._voices[voice]
