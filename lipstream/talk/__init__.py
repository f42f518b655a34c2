"""Talk: speech around the avatar. Voices (TTS: Piper, eSpeak NG; `speaker.Speaker` turns text into
sentence Speech), speech recognition (Whisper in a child process, or OpenAI-compatible), the voice activity
and turn-end detectors, echo cancellation, language models (embedded in a child process, or
OpenAI-compatible), knowledge and persona
grounding, and the conversation loop that joins them over any session with `session_port`'s shape."""
