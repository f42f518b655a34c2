"""Audio: decoding/resampling, the audio timeline, streaming buffers, feature extractors, VAD."""
