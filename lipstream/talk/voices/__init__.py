"""Speech out: text to speech, the voices, the sentence and phrase cuts, the speaker."""
