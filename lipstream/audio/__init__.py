"""Audio: decoding and resampling (`decode`), WAV out (`encode`), per-frame levels and silence (`levels`),
the 16 kHz audio timeline (`timeline`) and the `Speech` data shared by voices, recognisers and engines
(`speech`). Feature extractors live with their engines, VAD and echo cancellation in talk/."""
