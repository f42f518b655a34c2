"""MuseTalk v1.5/v1.0 neural engine (diffusers UNet + VAE, Whisper-tiny features)."""
