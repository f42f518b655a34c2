"""Speech in: the microphone listener, voice activity, echo cancellation, recognition, turn features."""
