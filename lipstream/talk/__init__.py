"""Talk: TTS providers now; STT, LLM and the conversation loop later."""
